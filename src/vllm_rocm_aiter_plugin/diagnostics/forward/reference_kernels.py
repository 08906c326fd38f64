"""Torch references for the kernels ROCM_AITER_FA's forward calls that cannot run without ROCm:
AITER's ``flash_attn_varlen_func``, ``paged_attention_v1``, ``paged_attention_common`` (the
shuffle layout's decode) and Triton ``unified_attention`` (the tests run AITER's own kernel too
and check the two agree); vLLM's C op ``reshape_and_cache_flash``; and, to check vLLM's own
Triton kernels against, its shuffle write and, for calls too large for the Triton interpreter,
``cp_mha_gather_cache``.

Each has the signature vLLM calls it with and the kernel's semantics, pinned to a source in its
docstring; each checks the arguments its kernel relies on and raises ``LauncherError`` naming
what is wrong. Common semantics: causal masks aligned to the bottom right; a window
``(left, right)`` keeps keys in ``[pos - left, pos + right]``; a query with no key gives output 0
and lse -inf; lse is ``[heads, tokens]`` float32; rows past the last offset are never written.
:func:`installed` makes them importable where vLLM imports the real ones, only where those are
absent. ``tests/rocm/test_aiter_assumptions.py`` checks these assumptions on the real kernels."""

from __future__ import annotations

import contextlib
import importlib.machinery
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
"""MI300's (gfx942) and OCP's (gfx950) fp8 formats; vLLM views an fp8 cache as the platform's
``fp8_dtype()``."""
QUANTISED_CACHE_DTYPES = ("fp8", "fp8_e4m3")
"""What vLLM's ROCm cache write takes for an fp8 cache (``DISPATCH_BY_KV_CACHE_DTYPE``,
``csrc/quantization/fp8/amd/quant_utils.cuh``)."""


class LauncherError(AssertionError):
    """vLLM called a kernel with arguments the kernel cannot take."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise LauncherError(message)


def quantise(
    x: torch.Tensor, fp8_dtype: torch.dtype, scale: float, float32_division: bool = False
) -> torch.Tensor:
    """vLLM's ROCm cache write into an fp8 cache: ``x / scale`` (in fp16 for an fp16 ``x``, else
    float32), saturated to the format's range (``__HIP_SATFINITE``; NaN stays NaN), rounded to nearest
    even (``scaled_vec_conversion``, ``csrc/quantization/fp8/amd/quant_utils.cuh``, vLLM 0.23.0 and
    0.33.0). ``float32_division``: the shuffle layout's Triton write divides in float32."""
    _check(fp8_dtype in FP8_DTYPES, f"{fp8_dtype} is not an fp8 cache format")
    scaled = x.float() / scale
    if x.dtype == torch.float16 and not float32_division:
        scaled = scaled.half().float()
    largest = torch.finfo(fp8_dtype).max
    return scaled.clamp(-largest, largest).to(fp8_dtype)


def dequantise(cache: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """What a kernel reads from an fp8 cache: ``float(fp8) * scale`` (``quant_utils.cuh``); a 16-bit
    cache as is."""
    if cache.dtype not in FP8_DTYPES:
        return cache.float()
    value = float(scale) if isinstance(scale, float) else float(scale.reshape(-1)[0])
    return cache.float() * value


def _cache_dtype_matches(kv_cache_dtype: str, *caches: torch.Tensor) -> None:
    for cache in caches:
        if kv_cache_dtype == "auto":
            _check(cache.dtype in SUPPORTED_DTYPES, f"an 'auto' cache of {cache.dtype}")
            continue
        _check(
            kv_cache_dtype in QUANTISED_CACHE_DTYPES,
            f"kv_cache_dtype {kv_cache_dtype!r}: vLLM's ROCm cache ops take "
            f"{', '.join(QUANTISED_CACHE_DTYPES)} for fp8",
        )
        _check(cache.dtype in FP8_DTYPES, f"an {kv_cache_dtype} cache viewed as {cache.dtype}")


def _offsets(name: str, offsets: torch.Tensor) -> list[int]:
    _check(offsets.dim() == 1, f"{name} must be 1-D, got {tuple(offsets.shape)}")
    _check(offsets.dtype == torch.int32, f"{name} must be int32, got {offsets.dtype}")
    values = offsets.tolist()
    _check(values[0] == 0, f"{name} must start at 0, got {values[0]}")
    _check(all(b >= a for a, b in itertools.pairwise(values)), f"{name} decreases: {values}")
    return values


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    causal: bool,
    window: tuple[int, int] = (-1, -1),
    sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q [sq, heads, d], k/v [sk, kv_heads, d] -> (out [sq, heads, d], lse [heads, sq]),
    float32, with the common semantics above (``flash_attn_varlen_func``'s docstring,
    ``aiter/ops/mha.py``, amd-aiter 0.1.7.post2.dev18; CK's pipelines store lse -inf for a row with no
    key: ``ck_tile/ops/fmha/pipeline/block_fmha_pipeline_qr_ks_vs.hpp`` in that wheel).

    A ``sink`` (one logit per query head) counts once in the softmax and the lse, as a key with value
    zero: a row with no key gives output 0 and lse = the sink. CK's pipelines with a sink start the
    running maximum at it and the running sum at 1 (``ROCm/rocm-libraries`` at
    9f81047dda0f1ba0aa037c1b975863df6cd217ab,
    ``projects/composablekernel/include/ck_tile/ops/fmha/pipeline/block_fmha_pipeline_qr_ks_vs.hpp``,
    ``sink_v``); AITER's Triton ``unified_attention`` starts ``M`` at the sink and ``L`` at 1
    (``_triton_kernels/unified_attention.py``, amd-aiter 0.1.7.post2.dev18)."""
    sq, heads, _ = q.shape
    sk, kv_heads = k.shape[0], k.shape[1]
    _check(heads % kv_heads == 0, f"{heads} query heads do not divide into {kv_heads} kv heads")
    _check_sinks(sink, heads)
    if sq == 0 or sk == 0:
        out = torch.zeros(sq, heads, v.shape[-1], dtype=torch.float32, device=q.device)
        lse = torch.full((heads, sq), float("-inf"), device=q.device)
        if sink is not None:
            lse = sink.float()[:, None].expand(heads, sq).clone()
        return out, lse
    group = heads // kv_heads
    keys = k.float().repeat_interleave(group, dim=1)
    values = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys) * scale
    q_pos = torch.arange(sq, device=q.device)[:, None] + (sk - sq)
    k_pos = torch.arange(sk, device=q.device)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    if causal:
        keep &= k_pos <= q_pos
    left, right = window
    if left >= 0:
        keep &= k_pos >= q_pos - left
    if right >= 0:
        keep &= k_pos <= q_pos + right
    scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [heads, sq]; -inf where nothing is kept
    if sink is not None:
        lse = torch.logaddexp(lse, sink.float()[:, None])
    probs = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    out = torch.einsum("hqk,khd->qhd", probs, values)
    return out, lse


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    min_seqlen_q: int | None = None,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] | None = None,
    alibi_slopes: torch.Tensor | None = None,
    return_lse: bool = False,
    out: torch.Tensor | None = None,
    sink_ptr: torch.Tensor | None = None,
) -> Any:
    """``aiter.flash_attn_varlen_func``: varlen attention of packed q over packed k/v; with
    ``return_lse`` also lse ``[heads, total_q]`` float32 (``aiter/ops/mha.py``, amd-aiter
    0.1.7.post2.dev18). vLLM calls it causally over the new tokens and non-causally over each context
    chunk, where a row can have no keys (:func:`attend`).

    It follows AITER's CK route, ``mha_varlen_fwd``, where each call counts ``sink_ptr`` once:
    AITER hands it to CK from ROCm/aiter v0.1.10 on (ROCm/aiter#1753), and CK reads it for every
    call (``ROCm/rocm-libraries`` at 07c8e141cef75754c70692fea95f071d1e913561,
    ``projects/composablekernel/include/ck_tile/ops/fmha/kernel/fmha_fwd_kernel.hpp``). The pinned
    CPU wheel, amd-aiter 0.1.7.post2.dev18, has no ``sink_ptr``. AITER's v3 assembly route (bf16,
    head size 128 or 192) takes no sink: ``docs/upstream/aiter.md``, findings 5 and 6.

    A call with ``max_seqlen_k == 0`` is refused: AITER writes output 0 and lse +inf there
    (``ROCm/aiter`` at 2d3141ac61b60ab2aa5924f47ec83bbcdc3d0bfe,
    ``csrc/py_itfs_ck/mha_varlen_fwd_kernels.cu``), which no merge survives; vLLM makes no such call."""
    _check(q.dtype in SUPPORTED_DTYPES, f"q must be fp16 or bf16, got {q.dtype}")
    _check(k.dtype == q.dtype and v.dtype == q.dtype, "q, k and v must share a dtype")
    _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q, k, v must be [tokens, heads, d]")
    _check(dropout_p == 0.0, "dropout is not used at inference")
    _check(alibi_slopes is None, "alibi is not referenced here")
    _check_sinks(sink_ptr, q.shape[1])
    qo, ko = _offsets("cu_seqlens_q", cu_seqlens_q), _offsets("cu_seqlens_k", cu_seqlens_k)
    _check(len(qo) == len(ko), f"{len(qo) - 1} query sequences but {len(ko) - 1} key sequences")
    _check(qo[-1] <= q.shape[0], f"cu_seqlens_q ends at {qo[-1]} past {q.shape[0]} query rows")
    _check(ko[-1] <= k.shape[0], f"cu_seqlens_k ends at {ko[-1]} past {k.shape[0]} key rows")
    q_lens = [b - a for a, b in itertools.pairwise(qo)]
    k_lens = [b - a for a, b in itertools.pairwise(ko)]
    _check(max(q_lens, default=0) <= max_seqlen_q, f"max_seqlen_q {max_seqlen_q} < {max(q_lens)}")
    _check(max(k_lens, default=0) <= max_seqlen_k, f"max_seqlen_k {max_seqlen_k} < {max(k_lens)}")
    _check(max_seqlen_k > 0, "a call with max_seqlen_k == 0 (AITER: output 0, lse +inf)")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    window = (window_size[0], window_size[1]) if window_size is not None else (-1, -1)
    if out is None:
        out = torch.empty_like(q)
    else:
        _check(out.shape == q.shape and out.dtype == q.dtype, "out must be like q")
    lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)
    for i in range(len(q_lens)):
        o, s = attend(
            q[qo[i] : qo[i + 1]],
            k[ko[i] : ko[i + 1]],
            v[ko[i] : ko[i + 1]],
            scale,
            causal,
            window,
            sink_ptr,
        )
        out[qo[i] : qo[i + 1]] = o.to(out.dtype)
        lse[:, qo[i] : qo[i + 1]] = s
    return (out, lse) if return_lse else out


def _check_sinks(sinks: torch.Tensor | None, heads: int) -> None:
    if sinks is not None:
        _check(sinks.shape == (heads,), f"one sink per query head, got {tuple(sinks.shape)}")
        _check(sinks.is_floating_point(), f"sinks must be floating point, got {sinks.dtype}")


def _paged_keys(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` tokens of one sequence from a [blocks, block_size, kv_heads, d] cache."""
    positions = torch.arange(length, device=cache.device)
    block_size = cache.shape[1]
    blocks = block_table[positions // block_size].long()
    return cache[blocks, positions % block_size]


def paged_attention_v1(
    out: torch.Tensor,
    workspace_buffer: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    scale: float,
    block_tables: torch.Tensor,
    cu_query_lens: torch.Tensor | None,
    context_lens: torch.Tensor,
    max_context_len: int,
    alibi_slopes: torch.Tensor | None,
    kv_cache_dtype: str,
    kv_cache_layout: str,
    logits_soft_cap: float,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    fp8_out_scale: torch.Tensor | None = None,
    partition_size: int = 256,
    mtp: int = 1,
    sliding_window: int = 0,
) -> None:
    """``torch.ops.aiter.paged_attention_v1``: one query token per sequence against its
    ``context_lens`` cached tokens (the last ``sliding_window`` of them where > 0), an fp8 cache read
    with the layer's ``k_scale`` / ``v_scale`` (``aiter/ops/attention.py`` and
    ``csrc/kernels/attention_v1.cu``, amd-aiter 0.1.7.post2.dev18; vLLM's call for query length 1)."""
    _check(kv_cache_layout == "NHD", f"kv_cache_layout {kv_cache_layout!r}, expected 'NHD'")
    _cache_dtype_matches(kv_cache_dtype, key_cache, value_cache)
    _check(mtp == 1, f"mtp {mtp}: the decode path calls this kernel for one token per sequence")
    _check(alibi_slopes is None and not logits_soft_cap, "alibi and soft cap are not referenced")
    _check(query.dtype in SUPPORTED_DTYPES, f"query must be fp16 or bf16, got {query.dtype}")
    num_seqs = context_lens.shape[0]
    _check(block_tables.shape[0] == num_seqs, "one block-table row per sequence")
    lengths = context_lens.tolist()
    _check(max(lengths, default=0) <= max_context_len, f"max_context_len {max_context_len} short")
    starts = cu_query_lens.tolist() if cu_query_lens is not None else list(range(num_seqs))
    _check(len(starts) == num_seqs, f"{len(starts)} query offsets for {num_seqs} sequences")
    window = (sliding_window - 1 if sliding_window > 0 else -1, 0)
    _decode(out, query, starts, (key_cache, value_cache), block_tables, lengths, (k_scale, v_scale),
            scale, window)  # fmt: skip


def _decode(
    out: torch.Tensor,
    query: torch.Tensor,
    starts: list[int],
    caches: tuple[torch.Tensor, torch.Tensor],
    block_tables: torch.Tensor,
    lengths: list[int],
    scales: tuple[torch.Tensor | float, torch.Tensor | float],
    scale: float,
    window: tuple[int, int] = (-1, -1),
) -> None:
    """Query token ``starts[b]`` against the first ``lengths[b]`` tokens of its sequence in the
    ``[blocks, block_size, kv_heads, d]`` caches, causally; a sequence without a query token of
    its own (padding) or without keys is left alone."""
    for b, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        if start >= query.shape[0] or length == 0:
            continue
        k, v = (dequantise(_paged_keys(c, block_tables[b], length), s)
                for c, s in zip(caches, scales, strict=True))  # fmt: skip
        o, _ = attend(query[start : start + 1], k, v, scale, True, window)
        out[start : start + 1] = o.to(out.dtype)


def check_unified_attention(
    q: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    max_seqlen_q: int,
    seqused_k: torch.Tensor,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int],
    block_table: torch.Tensor,
    softcap: float,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    alibi_slopes: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    **unused: Any,
) -> list[int]:
    """The arguments vLLM's decode path passes to ``unified_attention``, checked against what the
    kernel reads (``aiter/ops/triton/unified_attention.py`` and ``_triton_kernels/unified_attention.py``,
    amd-aiter 0.1.7.post2.dev18): causal, no ``q_descale``, a block-table row and at least as many
    keys as queries per sequence, q ending at the last offset (the 3D path's ``reduce_segments`` writes
    every row of q). Returns the query offsets."""
    _check(not unused, f"unexpected arguments {sorted(unused)}")
    _check(causal, "the decode path calls unified_attention causally")
    _check(not softcap and alibi_slopes is None, "soft cap and alibi are not referenced here")
    _check_sinks(sinks, q.shape[1])
    _check(q_descale is None, "fp8 queries are not referenced here")
    _check(q.dtype in SUPPORTED_DTYPES, f"q must be fp16 or bf16, got {q.dtype}")
    _check(out.shape == q.shape and out.dtype == q.dtype, "out must be like q")
    qo = _offsets("cu_seqlens_q", cu_seqlens_q)
    lengths = seqused_k.tolist()
    _check(len(qo) == len(lengths) + 1, f"{len(qo) - 1} query sequences, {len(lengths)} lengths")
    _check(
        qo[-1] == q.shape[0],
        f"cu_seqlens_q ends at {qo[-1]}, q has {q.shape[0]} rows: AITER's 3D path writes every "
        "row of q (reduce_segments' grid), so rows past the last offset would not be left alone",
    )
    _check(block_table.shape[0] >= len(lengths), "one block-table row per sequence")
    q_lens = [b - a for a, b in itertools.pairwise(qo)]
    _check(max(q_lens, default=0) <= max_seqlen_q, f"max_seqlen_q {max_seqlen_q} short")
    _check(max(lengths, default=0) <= max_seqlen_k, f"max_seqlen_k {max_seqlen_k} short")
    for b, (q_len, length) in enumerate(zip(q_lens, lengths, strict=True)):
        _check(not q_len or length >= q_len, f"sequence {b}: {length} keys for {q_len} queries")
    return qo


def unified_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    **kwargs: Any,
) -> None:
    """``aiter.ops.triton.unified_attention.unified_attention``: varlen queries against paged keys
    (``seqused_k`` per sequence) in a ``[blocks, block_size, kv_heads, d]`` cache, causal, a window
    ``(left, right)`` kept as ``1 + left`` keys up to the query's own, ``sinks`` once
    (``_triton_kernels/unified_attention.py``, amd-aiter 0.1.7.post2.dev18). An fp8 cache is
    dequantised with one scale per call and rounded to q's dtype before the dot, as the kernel does;
    a 16-bit cache is read as it is."""
    qo = check_unified_attention(q, out, **kwargs)
    k_descale, v_descale = kwargs["k_descale"], kwargs["v_descale"]
    if k.dtype in FP8_DTYPES or v.dtype in FP8_DTYPES:
        _check(
            k.dtype == v.dtype and k_descale is not None and v_descale is not None,
            "an fp8 cache needs k_descale and v_descale (the kernel loads them unconditionally)",
        )
    lengths = kwargs["seqused_k"].tolist()
    block_table, window = kwargs["block_table"], kwargs["window_size"]

    def read(cache: torch.Tensor, descale: torch.Tensor | None, row: int) -> torch.Tensor:
        paged = _paged_keys(cache, block_table[row], lengths[row])
        if cache.dtype not in FP8_DTYPES:
            return paged
        assert descale is not None
        return dequantise(paged, descale).to(q.dtype)

    for b in range(len(lengths)):
        rows = slice(qo[b], qo[b + 1])
        if qo[b + 1] == qo[b]:
            continue
        keys = read(k, k_descale, b)
        values = read(v, v_descale, b)
        o, _ = attend(
            q[rows],
            keys,
            values,
            kwargs["softmax_scale"],
            True,
            (window[0], window[1]),
            kwargs.get("sinks"),
        )
        out[rows] = o.to(out.dtype)


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    shuffle: bool = False,
) -> None:
    """vLLM's ``_C_cache_ops.reshape_and_cache_flash``: token ``i`` to slot ``slot_mapping[i]`` of a
    ``[blocks, block_size, kv_heads, d]`` cache (negative slots, padding, skipped), an fp8 cache
    written as :func:`quantise` (``_custom_ops.reshape_and_cache_flash``; ``PAD_SLOT_ID``). With
    ``shuffle``, vLLM's ``reshape_and_cache_shuffle_triton``: the same slots in the shuffle layout
    (:func:`shuffled_views`), an fp8 cache divided in float32 and rounded to nearest even as the GPU
    does (the interpreter does not: ``harness.ShuffleWrite``)."""
    _cache_dtype_matches(kv_cache_dtype, key_cache, value_cache)
    _check(slot_mapping.dim() == 1, "slot_mapping must be 1-D")
    n = slot_mapping.shape[0]
    _check(key.shape[0] >= n and value.shape[0] >= n, "fewer tokens than slots")
    _check(key_cache.shape[2:] == key.shape[1:], "key rows and cache rows differ in shape")
    slots = slot_mapping.long()
    valid = slots >= 0
    block_size = key_cache.shape[1]
    _check(bool((slots[valid] < key_cache.shape[0] * block_size).all()), "slot past the cache")
    b, o = (slots[valid] // block_size)[:, None, None], (slots[valid] % block_size)[:, None, None]
    h = torch.arange(key.shape[1], device=key.device)[None, :, None]
    dims = torch.arange(key.shape[-1], device=key.device)
    views = shuffled_views(key_cache, value_cache) if shuffle else (key_cache, value_cache)
    for side, new, cache, scale in zip("kv", (key, value), views, (k_scale, v_scale), strict=True):
        rows = new[:n][valid]  # [tokens, kv_heads, d]
        if kv_cache_dtype != "auto":
            rows = quantise(rows, cache.dtype, float(scale.reshape(-1)[0]), shuffle)
        rows = rows.to(cache.dtype)
        if not shuffle:
            cache[b, o, h, dims] = rows
        elif side == "k":
            x = cache.shape[-1]
            cache[b, h, dims // x, o, dims % x] = rows
        else:
            x = cache.shape[-1]
            cache[b, h, o // x, dims, o % x] = rows


def cp_mha_gather_cache(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    block_tables: torch.Tensor,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    token_to_batch: torch.Tensor,
    seq_starts: torch.Tensor,
    dequant: bool,
    kv_cache_layout: str,
    total_tokens: int,
) -> None:
    """vLLM's ``cp_mha_gather_cache``: workspace token ``t`` of request ``b = token_to_batch[t]`` is
    the cached token at ``seq_starts[b] + t - cu_seqlens_kv[b]``; with ``dequant`` an fp8 cache is read
    as ``(float(fp8) * scale)`` in the workspace's dtype. Source: vLLM's own Triton kernel
    (``rocm_aiter_fa.py``), which must agree (``harness.Gather``)."""
    _check(kv_cache_layout in ("NHD", "SHUFFLE"), f"kv_cache_layout {kv_cache_layout!r}")
    if kv_cache_layout == "SHUFFLE":  # read through the shuffle views (the kernel's branch)
        key_cache, value_cache = unshuffled(*shuffled_views(key_cache, value_cache))
    fp8 = key_cache.dtype in FP8_DTYPES
    _check(dequant == fp8, f"dequant={dequant} for a {key_cache.dtype} cache")
    _check(total_tokens <= key.shape[0], f"{total_tokens} tokens for a {key.shape[0]} workspace")
    if total_tokens == 0:
        return
    offsets = _offsets("cu_seqlens_kv", cu_seqlens_kv)
    _check(offsets[-1] == total_tokens, f"cu_seqlens_kv ends at {offsets[-1]}, not {total_tokens}")
    t = torch.arange(total_tokens, device=key.device)
    b = token_to_batch[:total_tokens].long()
    _check(
        bool((b >= 0).all() and (b < block_tables.shape[0]).all()), "token_to_batch out of range"
    )
    positions = seq_starts.long()[b] + t - cu_seqlens_kv.long()[b]
    block_size = key_cache.shape[1]
    blocks = block_tables.long()[b, positions // block_size]
    for cache, scale, workspace in ((key_cache, k_scales, key), (value_cache, v_scales, value)):
        rows = cache[blocks, positions % block_size]
        workspace[:total_tokens] = dequantise(rows, scale).to(workspace.dtype) if fp8 else rows


def merge_attn_states(
    prefix_output: torch.Tensor,
    prefix_lse: torch.Tensor,
    suffix_output: torch.Tensor,
    suffix_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attention states merged, each of finite lse or empty (-inf), at least one finite:
    (output float32 ``[tokens, heads, d]``, lse ``[heads, tokens]``). Two empty states, and an
    lse of +inf, are left to vLLM's kernel, whose handling of them differs between releases."""
    lse = torch.logaddexp(prefix_lse, suffix_lse)
    weights = [
        torch.exp(part - lse).transpose(0, 1).unsqueeze(-1) for part in (prefix_lse, suffix_lse)
    ]
    output = prefix_output.float() * weights[0] + suffix_output.float() * weights[1]
    return output, lse


SHUFFLE_BYTES = 16
"""The shuffle layout's vector width: ``x = 16 // element_size`` elements."""


def shuffled_views(
    key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A side of the shuffle layout (``[blocks, block_size, kv_heads, d]``, reinterpreted in place) as
    its 5-D views, K ``[blocks, kv_heads, d // x, block_size, x]`` and V ``[blocks, kv_heads,
    block_size // x, d, x]`` (vLLM's shuffle write and decode call; AITER's ``pa_fwd``)."""
    blocks, block_size, kv_heads, d = key_cache.shape
    x = SHUFFLE_BYTES // key_cache.element_size()
    _check(d % x == 0 and block_size % x == 0, f"d {d}, block size {block_size}: not x={x} tiles")
    return (
        key_cache.reshape(blocks, kv_heads, d // x, block_size, x),
        value_cache.reshape(blocks, kv_heads, block_size // x, d, x),
    )


def unshuffled(k5: torch.Tensor, v5: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 5-D shuffle views as ``[blocks, block_size, kv_heads, d]`` copies."""
    blocks, kv_heads, _, block_size, _ = k5.shape
    d = v5.shape[3]
    keys = k5.permute(0, 3, 1, 2, 4).reshape(blocks, block_size, kv_heads, d)
    values = v5.permute(0, 2, 4, 1, 3).reshape(blocks, block_size, kv_heads, d)
    return keys, values


def paged_attention_common(
    Q: torch.Tensor,
    K: torch.Tensor,
    V: torch.Tensor,
    tmp_out: torch.Tensor,
    max_logits: torch.Tensor,
    exp_sums: torch.Tensor,
    max_seq_len: int,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables_stride0: int,
    scale: float,
    K_QScale_hip: torch.Tensor | None = None,
    V_QScale_hip: torch.Tensor | None = None,
    K_QScale_asm: torch.Tensor | None = None,
    V_QScale_asm: torch.Tensor | None = None,
    out_: torch.Tensor | None = None,
    kv_cache_dtype: str = "auto",
    **unused: Any,
) -> torch.Tensor:
    """``aiter.paged_attention_common``, vLLM's decode under the shuffle layout: one query token per
    sequence against the 5-D views (``pa_fwd``, ``csrc/include/attention_asm.h``;
    ``aiter/ops/attention.py``). K and V must each be a dense plane of pages, and the asm kernel's
    per-slot scale tables must hold the per-tensor scale."""
    _check(not unused, f"unexpected arguments {sorted(unused)}")
    _cache_dtype_matches(kv_cache_dtype, K, V)
    _check(Q.dtype in SUPPORTED_DTYPES, f"Q must be fp16 or bf16, got {Q.dtype}")
    _check(K.dim() == 5 and V.dim() == 5, "K and V must be the 5-D shuffle views")
    num_seqs = context_lens.shape[0]
    _check(Q.shape[0] == num_seqs, f"{Q.shape[0]} query tokens for {num_seqs} sequences")
    _check(block_tables.shape[0] == num_seqs, "one block-table row per sequence")
    _check(block_tables_stride0 == block_tables.stride(0), "block_tables_stride0 is not the stride")
    blocks, kv_heads, _, block_size, _ = K.shape
    page = K[0].numel()
    _check(
        K.stride(0) == page and V.stride(0) == page,
        "K and V must each be a dense plane of pages: the kernel derives a page's address from "
        "the block number (vLLM 0.33.0's own assert before this call)",
    )
    scales = []
    for hip, asm, side in ((K_QScale_hip, K_QScale_asm, "K"), (V_QScale_hip, V_QScale_asm, "V")):
        if kv_cache_dtype == "auto":
            scales.append(1.0)
            continue
        _check(hip is not None and hip.numel() == 1, f"{side}_QScale_hip must be one scale")
        assert hip is not None
        value = float(hip.reshape(-1)[0])
        if asm is not None:
            _check(
                tuple(asm.shape) == (blocks, kv_heads, block_size),
                f"{side}_QScale_asm is {tuple(asm.shape)}, the cache needs "
                f"{(blocks, kv_heads, block_size)}",
            )
            _check(
                bool((asm == value).all()),
                f"{side}_QScale_asm holds other values than {side}_QScale_hip ({value})",
            )
        scales.append(value)
    keys, values = unshuffled(K, V)
    lengths = context_lens.tolist()
    _check(max(lengths, default=0) <= max_seq_len, f"max_seq_len {max_seq_len} short")
    out = out_ if out_ is not None else torch.empty_like(Q)
    _decode(out, Q, list(range(num_seqs)), (keys, values), block_tables, lengths,
            (scales[0], scales[1]), scale)  # fmt: skip
    return out


def flash_attn_with_kvcache(*args: Any, **kwargs: Any) -> Any:
    """The non-causal decode path, which no decoder model takes; not referenced."""
    raise LauncherError("non-causal decode (flash_attn_with_kvcache) is not referenced here")


_PAGED_ATTENTION_SCHEMA = (
    "paged_attention_v1(Tensor(a!) out, Tensor workspace_buffer, Tensor query, Tensor key_cache, "
    "Tensor value_cache, float scale, Tensor block_tables, Tensor? cu_query_lens, "
    "Tensor context_lens, int max_context_len, Tensor? alibi_slopes, str kv_cache_dtype, "
    "str kv_cache_layout, float logits_soft_cap, Tensor k_scale, Tensor v_scale, "
    "Tensor? fp8_out_scale=None, int partition_size=256, int mtp=1, int sliding_window=0) -> ()"
)
_RESHAPE_AND_CACHE_SCHEMA = (
    "reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, "
    "Tensor(b!) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, "
    "Tensor v_scale) -> ()"
)


def _has_op(namespace: str, name: str) -> bool:
    try:
        torch._C._get_schema(f"{namespace}::{name}", "")
    except RuntimeError:
        return False
    return True


def _module(name: str, **attributes: Any) -> types.ModuleType:
    module = types.ModuleType(name, "torch reference (vllm_rocm_aiter_plugin forward tier)")
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    module.__path__ = []  # a package, so that its submodules import
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def aiter_available() -> bool:
    """Whether the real ``aiter`` imports: on ROCm only."""
    from vllm.platforms import current_platform

    from vllm_rocm_aiter_plugin.diagnostics.hardware import probe_aiter

    return current_platform.is_rocm() and probe_aiter().importable


@contextlib.contextmanager
def installed(
    unified_attention_kernel: Callable[..., None] | None = None,
) -> Iterator[list[str]]:
    """Within the block, the references stand where vLLM imports the real kernels, for each one that
    is absent (``unified_attention_kernel``, where given, instead of its reference). Yields the names
    of the references installed."""
    names: list[str] = []
    libraries = []
    modules: dict[str, types.ModuleType] = {}
    if not aiter_available():
        modules = {
            "aiter": _module(
                "aiter",
                flash_attn_varlen_func=flash_attn_varlen_func,
                paged_attention_common=paged_attention_common,
            ),
            "aiter.ops": _module("aiter.ops"),
            "aiter.ops.triton": _module("aiter.ops.triton"),
            "aiter.ops.triton.unified_attention": _module(
                "aiter.ops.triton.unified_attention",
                unified_attention=unified_attention_kernel or unified_attention,
            ),
            "aiter.ops.triton.attention": _module("aiter.ops.triton.attention"),
            "aiter.ops.triton.attention.mha_v3": _module(
                "aiter.ops.triton.attention.mha_v3", flash_attn_with_kvcache=flash_attn_with_kvcache
            ),
        }
        names += ["aiter.flash_attn_varlen_func", "aiter.paged_attention_common"]
        if not getattr(unified_attention_kernel, "is_aiter", False):
            names.append("aiter...unified_attention")
    if not _has_op("aiter", "paged_attention_v1"):
        library = torch.library.Library("aiter", "FRAGMENT")
        library.define(_PAGED_ATTENTION_SCHEMA)
        library.impl("paged_attention_v1", paged_attention_v1, "CompositeExplicitAutograd")
        libraries.append(library)
        names.append("torch.ops.aiter.paged_attention_v1")
    if not _has_op("_C_cache_ops", "reshape_and_cache_flash"):
        library = torch.library.Library("_C_cache_ops", "FRAGMENT")
        library.define(_RESHAPE_AND_CACHE_SCHEMA)
        library.impl(
            "reshape_and_cache_flash", reshape_and_cache_flash, "CompositeExplicitAutograd"
        )
        libraries.append(library)
        names.append("torch.ops._C_cache_ops.reshape_and_cache_flash")
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield names
    finally:
        if modules:  # what loaded under the stand-ins' package goes with them
            for name in [n for n in sys.modules if n.split(".")[0] == "aiter" and n not in saved]:
                del sys.modules[name]
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous
        for library in libraries:
            library._destroy()
