"""Torch references for the compiled kernels ROCM_AITER_FA's forward calls that cannot run without
ROCm: AITER's ``flash_attn_varlen_func``, ``paged_attention_v1``, ``paged_attention_common`` (the
shuffle layout's decode) and, where the ``amd-aiter`` wheel cannot load (:mod:`.aiter_triton`),
Triton ``unified_attention``; vLLM's C op ``reshape_and_cache_flash``; and, to check vLLM's own
Triton kernels against, its shuffle write and, for calls too large for the Triton interpreter,
``cp_mha_gather_cache``.

Each has the signature vLLM calls it with and the kernel's semantics, each pinned to a source in
its docstring (a CK file, an AITER function or a vLLM call site, with the version read):
- causal masks are aligned to the bottom right (a query's position is ``seqlen_k - seqlen_q + i``);
- a sliding window ``(left, right)`` keeps keys within ``[pos - left, pos + right]``;
- a query with no key to attend to gives output 0 and lse -inf;
- lse is ``[heads, tokens]``, float32;
- rows past the last offset are never written (the caller's buffer keeps whatever it held).
Each checks the arguments its kernel relies on (dtypes, shapes, offsets, that the declared maxima
cover the real lengths) and raises ``LauncherError`` naming what is wrong.

``installed()`` makes them importable the way vLLM imports them (``aiter``, whose
``paged_attention_common`` vLLM's own ``rocm_aiter_ops`` wrapper imports;
``aiter.ops.triton.unified_attention``, ``torch.ops.aiter.paged_attention_v1``,
``torch.ops._C_cache_ops.reshape_and_cache_flash``) for the duration of a ``with`` block, only
where the real ones are absent. The MI300 tier's first-run check
(``tests/rocm/test_aiter_assumptions.py``) calls the real ``flash_attn_varlen_func`` as vLLM's
extend path does and fails naming the assumption it disproves.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import itertools
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fnuz, torch.float8_e4m3fn)
"""The caches' fp8 formats: MI300's (gfx942) and OCP's (gfx950); vLLM views an fp8 cache as the
platform's ``fp8_dtype()`` in ``forward`` and ``do_kv_cache_update``."""
QUANTISED_CACHE_DTYPES = ("fp8", "fp8_e4m3")
"""The ``kv_cache_dtype`` strings vLLM's ROCm cache write takes for an fp8 cache
(``DISPATCH_BY_KV_CACHE_DTYPE``, ``csrc/quantization/fp8/amd/quant_utils.cuh``); it refuses the
others ("Unsupported data type of kv cache")."""


class LauncherError(AssertionError):
    """vLLM called a kernel with arguments the kernel cannot take."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise LauncherError(message)


def quantise(
    x: torch.Tensor, fp8_dtype: torch.dtype, scale: float, float32_division: bool = False
) -> torch.Tensor:
    """vLLM's ROCm cache write of ``x`` into an fp8 cache: ``x / scale`` (in fp16 for an fp16
    ``x``: ``tmp.data /= scale`` on a ``__half_raw``; in float32 for bf16), then converted with
    the fp8 type's default saturation, ``__HIP_SATFINITE`` (out-of-range values become the
    largest finite value of their sign, NaN stays NaN), rounding to nearest even
    (``scaled_vec_conversion<uint8_t, ...>``, ``csrc/quantization/fp8/amd/quant_utils.cuh``,
    vLLM main, read for 0.23.0 and 0.33.0). ``float32_division``: the shuffle layout's Triton
    write, ``(k_val.to(tl.float32) / k_scale).to(k_dtype)`` (:func:`reshape_and_cache_shuffle`)."""
    _check(fp8_dtype in FP8_DTYPES, f"{fp8_dtype} is not an fp8 cache format")
    scaled = x.float() / scale
    if x.dtype == torch.float16 and not float32_division:
        scaled = scaled.half().float()
    largest = torch.finfo(fp8_dtype).max
    return scaled.clamp(-largest, largest).to(fp8_dtype)


def dequantise(cache: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """What a kernel reads from an fp8 cache: ``float(fp8) * scale`` in float32 (vLLM's
    convention, ``Dequant(FP8) * scale => HP``, ``quant_utils.cuh``); a 16-bit cache as is."""
    if cache.dtype not in FP8_DTYPES:
        return cache.float()
    value = float(scale) if isinstance(scale, float) else float(scale.reshape(-1)[0])
    return cache.float() * value


def _cache_dtype_matches(kv_cache_dtype: str, cache: torch.Tensor) -> None:
    if kv_cache_dtype == "auto":
        _check(cache.dtype in SUPPORTED_DTYPES, f"an 'auto' cache of {cache.dtype}")
    else:
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
    """One sequence: q [sq, heads, d], k/v [sk, kv_heads, d] -> (out [sq, heads, d] float32,
    lse [heads, sq] float32).

    - Causal is bottom-right aligned and a window ``(left, right)`` keeps keys in
      ``[i + sk - sq - left, i + sk - sq + right]``: ``flash_attn_varlen_func``'s docstring
      (``aiter/ops/mha.py``, amd-aiter 0.1.7.post2.dev18).
    - A row with no key gives output 0 and lse -inf: CK's fmha forward pipelines return their
      cleared accumulator and store lse ``-infinity`` when ``num_total_loop <= 0``
      (``ck_tile/ops/fmha/pipeline/block_fmha_pipeline_qr_ks_vs.hpp`` and its siblings, in
      ``aiter_meta/3rdparty/composable_kernel`` of that wheel). vLLM's extend path relies on it
      for every context chunk a row has no keys in (``extend_forward``'s ``merge_attn_states``,
      0.23.0 and 0.33.0). AITER's Triton MHA kernels differ (lse 0.0): ``docs/upstream/aiter.md``.
    - ``sink`` (one logit per query head, in the units of the scaled scores): a key with that
      score and a zero value, counted once in the softmax and in the lse, so a row with no key
      gives output 0 and lse = the sink. CK's forward pipelines with a sink start the running
      maximum at it and the running sum at 1, store ``m + log(l)`` as lse and, on the early exit
      for a row with no keys, the sink itself (``ROCm/rocm-libraries``,
      ``projects/composablekernel/include/ck_tile/ops/fmha/pipeline/
      block_fmha_pipeline_qr_ks_vs.hpp`` at 9f81047dda0f1ba0aa037c1b975863df6cd217ab, ``sink_v``).
      That is CK's route, which AITER's ``flash_attn_varlen_func`` takes through
      ``mha_varlen_fwd`` once it passes ``sink_ptr`` (ROCm/aiter#1753, AITER v0.1.10; the pinned
      CPU wheel, amd-aiter 0.1.7.post2.dev18, has no ``sink_ptr``). AITER's Triton
      ``unified_attention`` starts ``M`` at the sink and ``L`` at 1
      (``_triton_kernels/unified_attention.py``, amd-aiter 0.1.7.post2.dev18).
    """
    sq, heads, _ = q.shape
    sk, kv_heads = k.shape[0], k.shape[1]
    _check(heads % kv_heads == 0, f"{heads} query heads do not divide into {kv_heads} kv heads")
    if sink is not None:
        _check(sink.shape == (heads,), f"one sink per query head, got {tuple(sink.shape)}")
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
    ``return_lse`` also lse ``[heads, total_q]`` float32 (the ``softmax_lse`` of its docstring,
    ``aiter/ops/mha.py``, amd-aiter 0.1.7.post2.dev18; vLLM's extend path hands it to
    ``merge_attn_states`` as ``[heads, tokens]``, ``rocm_aiter_fa.py`` 0.23.0 and 0.33.0). vLLM
    calls it causally over the new tokens and non-causally over each context chunk, where a row
    can have ``seqlen_k = 0`` (:func:`attend` for what that gives).

    It follows AITER's CK route, ``mha_varlen_fwd``. There each call counts ``sink_ptr`` (one
    float32 logit per query head) once, masked or not: AITER hands it to ``mha_varlen_fwd`` from
    ROCm/aiter v0.1.10 on (``aiter/ops/mha.py``, ``csrc/py_itfs_ck/mha_varlen_fwd_kernels.cu``,
    ROCm/aiter#1753), and CK's kernel reads it for every call (``ROCm/rocm-libraries`` at
    07c8e141cef75754c70692fea95f071d1e913561, ``projects/composablekernel/include/ck_tile/ops/
    fmha/kernel/fmha_fwd_kernel.hpp``, ``run_``) into pipelines that start the running maximum at
    it (at 9f81047dda0f1ba0aa037c1b975863df6cd217ab ``block_fmha_pipeline_qr_ks_vs.hpp`` and at
    2602e2b19e7a5312994d40c42abf52d1e5bf392d ``block_fmha_pipeline_qr_ks_vs_async.hpp``, same
    directory as :func:`attend` names). The pinned CPU wheel, amd-aiter 0.1.7.post2.dev18, has
    no ``sink_ptr``. AITER's other route, its v3 assembly kernel (``fmha_v3_varlen_fwd``: bf16,
    head size 128 or, on gfx950, 192, no sliding window; ``_flash_attn_varlen_forward`` in the
    pinned wheel's ``aiter/ops/mha.py``), takes no sink: the coverage matrix of
    ``docs/testing.md`` says which route each forward case would take on an MI300, and
    ``docs/upstream/aiter.md`` (findings 5 and 6) what differs there.

    A whole call with ``max_seqlen_k == 0`` is refused: AITER skips the kernel and writes output
    0 and lse **+inf** (``ROCm/aiter``, ``csrc/py_itfs_ck/mha_varlen_fwd_kernels.cu`` at
    2d3141ac61b60ab2aa5924f47ec83bbcdc3d0bfe, ``mha_varlen_fwd``'s ``else`` branch), which no
    merge survives and no sink changes. vLLM makes no such call (every context chunk it runs holds
    the longest context's keys; new-token calls have at least one key per row), and this check
    is what says so for every call the forward and engine tiers make."""
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
    """``torch.ops.aiter.paged_attention_v1``: one query token per sequence (``mtp`` = 1) against
    its ``context_lens`` cached tokens; ``sliding_window`` > 0 keeps the last that many. Sources:
    the signature of ``aiter/ops/attention.py::paged_attention_v1`` and the HIP kernel, which
    reads ``context_lens[seq_idx]`` keys and the query at ``cu_query_lens[seq_idx]``
    (``aiter_meta/csrc/kernels/attention_v1.cu``), amd-aiter 0.1.7.post2.dev18; vLLM's call for
    query length 1 (``AiterFlashAttentionImpl.forward``, 0.23.0 and 0.33.0). An fp8 cache is
    read as :func:`dequantise` with the ``k_scale`` / ``v_scale`` vLLM passes (the layer's)."""
    _check(kv_cache_layout == "NHD", f"kv_cache_layout {kv_cache_layout!r}, expected 'NHD'")
    _cache_dtype_matches(kv_cache_dtype, key_cache)
    _cache_dtype_matches(kv_cache_dtype, value_cache)
    _check(mtp == 1, f"mtp {mtp}: the decode path calls this kernel for one token per sequence")
    _check(alibi_slopes is None and not logits_soft_cap, "alibi and soft cap are not referenced")
    _check(query.dtype in SUPPORTED_DTYPES, f"query must be fp16 or bf16, got {query.dtype}")
    num_seqs = context_lens.shape[0]
    _check(block_tables.shape[0] == num_seqs, "one block-table row per sequence")
    lengths = context_lens.tolist()
    _check(max(lengths, default=0) <= max_context_len, f"max_context_len {max_context_len} short")
    starts = cu_query_lens.tolist() if cu_query_lens is not None else list(range(num_seqs))
    _check(len(starts) == num_seqs, f"{len(starts)} query offsets for {num_seqs} sequences")
    for b, (start, length) in enumerate(zip(starts, lengths, strict=True)):
        if start >= query.shape[0] or length == 0:
            continue  # a padded sequence: no query token of its own
        k = dequantise(_paged_keys(key_cache, block_tables[b], length), k_scale)
        v = dequantise(_paged_keys(value_cache, block_tables[b], length), v_scale)
        window = (sliding_window - 1 if sliding_window > 0 else -1, 0)
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
    kernel reads; returns the query offsets. Sources: AITER's own asserts (``causal``, no
    ``q_descale``: ``aiter/ops/triton/unified_attention.py``, amd-aiter 0.1.7.post2.dev18); the
    kernel reads ``seqused_k[i]`` keys through ``block_table[i]`` for the queries between
    ``cu_seqlens_q[i]`` and ``cu_seqlens_q[i + 1]`` and ends the last sequence's rows at
    ``cu_seqlens_q[num_seqs]`` (``_triton_kernels/unified_attention.py``), so each sequence
    needs a block-table row and at least as many keys as queries (its queries are its last keys);
    its 3D path's ``reduce_segments`` runs over every row of q, so q must end at the last offset.
    vLLM passes ``query[:num_decode_tokens]``, ``seq_lens[:num_decodes]`` and
    ``query_start_loc[:num_decodes + 1]`` (``rocm_aiter_fa.py``,
    ``AiterFlashAttentionImpl.forward``, 0.23.0 and 0.33.0): all of that holds."""
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
    """``aiter.ops.triton.unified_attention.unified_attention``: varlen queries against paged
    keys (``seqused_k`` per sequence) in a ``[blocks, block_size, kv_heads, d]`` cache (the
    kernel reads ``block_size = v.shape[1]``, ``num_kv_heads = k.shape[2]``), causal aligned to
    the bottom right (the kernel's ``context_len = seq_len - cur_batch_query_len`` offsets each
    query's position), a window ``(left, right)`` kept as ``SLIDING_WINDOW = 1 + left`` keys up
    to the query's own, ``sinks`` counted once (``_triton_kernels/unified_attention.py``,
    amd-aiter 0.1.7.post2.dev18; :func:`attend`). Where that wheel loads, the forward tier runs
    the kernel itself (:mod:`.aiter_triton`) and a test cross-checks the two.

    An fp8 cache is dequantised with one scale per call, the first element of ``k_descale`` /
    ``v_descale`` (the kernel's ``tl.load(k_scale)``), then rounded to q's dtype before the dot
    (``(K_load.to(tl.float32) * tl.load(k_scale)).to(Q.dtype)``, ``if K_load.dtype.is_fp8()``);
    a 16-bit cache is read as it is, whatever descales are passed (the kernel skips them)."""
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
) -> None:
    """vLLM's ``_C_cache_ops.reshape_and_cache_flash``: token ``i`` goes to slot
    ``slot_mapping[i]`` of a [blocks, block_size, kv_heads, d] cache; negative slots (padding)
    are skipped. The slot mapping's length is the number of tokens written. Sources: vLLM's
    ``_custom_ops.reshape_and_cache_flash`` and ``do_kv_cache_update``'s call with
    ``slot_mapping`` from the forward context, whose padding slots are -1 (``rocm_aiter_fa.py``
    and ``PAD_SLOT_ID`` of ``vllm/v1/attention/backends/utils.py``, 0.23.0 and 0.33.0). An fp8
    cache is written as :func:`quantise` with ``k_scale`` / ``v_scale``."""
    _cache_dtype_matches(kv_cache_dtype, key_cache)
    _cache_dtype_matches(kv_cache_dtype, value_cache)
    _check(slot_mapping.dim() == 1, "slot_mapping must be 1-D")
    n = slot_mapping.shape[0]
    _check(key.shape[0] >= n and value.shape[0] >= n, "fewer tokens than slots")
    _check(key_cache.shape[2:] == key.shape[1:], "key rows and cache rows differ in shape")
    slots = slot_mapping.long()
    valid = slots >= 0
    block_size = key_cache.shape[1]
    _check(bool((slots[valid] < key_cache.shape[0] * block_size).all()), "slot past the cache")
    blocks, offsets = slots[valid] // block_size, slots[valid] % block_size
    for new, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        rows = new[:n][valid]
        if kv_cache_dtype == "auto":
            cache[blocks, offsets] = rows.to(cache.dtype)
        else:
            cache[blocks, offsets] = quantise(rows, cache.dtype, float(scale.reshape(-1)[0]))


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
    """vLLM's ``cp_mha_gather_cache``: workspace token ``t`` of request ``b = token_to_batch[t]``
    is the cached token at position ``seq_starts[b] + t - cu_seqlens_kv[b]``. Source: vLLM's own
    Triton kernel (``rocm_aiter_fa.py``, 0.23.0 and 0.33.0), which the tier runs on every call
    up to its token budget and on the first tokens of every larger one, and which must agree
    (``harness.Gather``). With ``dequant`` an fp8 cache is read as the kernel does:
    ``(float(fp8) * scale).to(workspace dtype)``, one scale (``tl.load(k_scale_ptr)``)."""
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


SHUFFLE_BYTES = 16
"""The shuffle layout's vector width in bytes: ``x = 16 // element_size`` elements (vLLM's
``reshape_and_cache_shuffle_triton`` and ``cp_mha_gather_cache``; AITER's ``pa_fwd``)."""


def shuffled_views(
    key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A side of the shuffle layout as vLLM hands it to the kernels (``[blocks, block_size,
    kv_heads, d]``, reinterpreted in place) -> its 5-D views, K ``[blocks, kv_heads, d // x,
    block_size, x]`` and V ``[blocks, kv_heads, block_size // x, d, x]``: the write kernel's
    offsets and the reshape of vLLM's shuffle decode call (``rocm_aiter_fa.py``, 0.23.0 and
    0.33.0), AITER's ``pa_fwd`` (``csrc/include/attention_asm.h``)."""
    blocks, block_size, kv_heads, d = key_cache.shape
    x = SHUFFLE_BYTES // key_cache.element_size()
    _check(d % x == 0 and block_size % x == 0, f"d {d}, block size {block_size}: not x={x} tiles")
    return (
        key_cache.reshape(blocks, kv_heads, d // x, block_size, x),
        value_cache.reshape(blocks, kv_heads, block_size // x, d, x),
    )


def unshuffled(k5: torch.Tensor, v5: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 5-D shuffle views -> ``[blocks, block_size, kv_heads, d]`` copies (token-major)."""
    blocks, kv_heads, _, block_size, _ = k5.shape
    d = v5.shape[3]
    keys = k5.permute(0, 3, 1, 2, 4).reshape(blocks, block_size, kv_heads, d)
    values = v5.permute(0, 2, 4, 1, 3).reshape(blocks, block_size, kv_heads, d)
    return keys, values


# The same parameters as reshape_and_cache_flash above: both stand for vLLM ops whose signatures
# the references keep (duplicates reports the pair; the bodies differ).
def reshape_and_cache_shuffle(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scales: torch.Tensor,
    v_scales: torch.Tensor,
) -> None:
    """vLLM's ``reshape_and_cache_shuffle_triton``: token ``i`` to slot ``slot_mapping[i]``
    (negative: skipped) in the shuffle layout (:func:`shuffled_views`); an fp8 cache gets
    ``(float32(x) / scale).to(fp8)`` with one scale (``tl.load(k_scale_ptr)``), rounded to
    nearest even (the GPU's conversion; the Triton interpreter's differs, ``harness.ShuffleWrite``).
    Source: the kernel in ``rocm_aiter_fa.py``, 0.23.0 and 0.33.0."""
    _cache_dtype_matches(kv_cache_dtype, key_cache)
    _cache_dtype_matches(kv_cache_dtype, value_cache)
    k5, v5 = shuffled_views(key_cache, value_cache)
    block_size = key_cache.shape[1]
    x = k5.shape[-1]
    n = slot_mapping.shape[0]
    slots = slot_mapping.long()
    valid = slots >= 0
    _check(bool((slots[valid] < key_cache.shape[0] * block_size).all()), "slot past the cache")
    blocks, offsets = slots[valid] // block_size, slots[valid] % block_size
    d = key.shape[-1]
    dims = torch.arange(d, device=key.device)
    for new, cache, scale, side in ((key, k5, k_scales, "k"), (value, v5, v_scales, "v")):
        rows = new[:n][valid]  # [tokens, kv_heads, d]
        if kv_cache_dtype != "auto":
            rows = quantise(rows, cache.dtype, float(scale.reshape(-1)[0]), float32_division=True)
        rows = rows.to(cache.dtype)
        b = blocks[:, None, None]
        h = torch.arange(rows.shape[1], device=key.device)[None, :, None]
        o = offsets[:, None, None]
        if side == "k":
            cache[b, h, dims // x, o, dims % x] = rows
        else:
            cache[b, h, o // x, dims, o % x] = rows


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
    """``aiter.paged_attention_common``, the decode kernel vLLM calls under the shuffle layout:
    one query token per sequence against its ``context_lens`` keys in K ``[blocks, kv_heads,
    d // x, block_size, x]`` / V ``[blocks, kv_heads, block_size // x, d, x]`` (the shapes of
    ``pa_fwd``, ``csrc/include/attention_asm.h``; ``num_kv_heads = K.size(1)``,
    ``block_size = K.size(3)`` in ``paged_attention_common``, ``aiter/ops/attention.py``). It
    runs AITER's asm kernel (head size 128, large batches; per-slot scale tables
    ``K_QScale_asm`` ``[blocks, kv_heads, block_size]``) or the HIP kernel (per-tensor
    ``K_QScale_hip``); the two must describe one scale, which is checked, and an fp8 cache is
    read as :func:`dequantise` with it. vLLM's call: ``AiterFlashAttentionImpl.forward``,
    0.23.0 and 0.33.0."""
    _check(not unused, f"unexpected arguments {sorted(unused)}")
    _cache_dtype_matches(kv_cache_dtype, K)
    _cache_dtype_matches(kv_cache_dtype, V)
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
    for b, length in enumerate(lengths):
        if length == 0:
            continue
        k = dequantise(_paged_keys(keys, block_tables[b], length), scales[0])
        v = dequantise(_paged_keys(values, block_tables[b], length), scales[1])
        o, _ = attend(Q[b : b + 1], k, v, scale, True)
        out[b : b + 1] = o.to(out.dtype)
    return out


def flash_attn_with_kvcache(*args: Any, **kwargs: Any) -> Any:
    """``aiter.ops.triton.attention.mha_v3.flash_attn_with_kvcache``: the non-causal decode path,
    which no decoder model takes; not referenced."""
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
    """Whether the real ``aiter`` imports: on ROCm only (elsewhere its ``__init__`` raises, and
    leaves half-loaded modules behind)."""
    from vllm.platforms import current_platform

    if not current_platform.is_rocm() or importlib.util.find_spec("aiter") is None:
        return False
    try:
        import aiter  # noqa: F401
    except Exception:  # aiter raises all sorts of errors off-ROCm
        return False
    return True


@contextlib.contextmanager
def installed(
    unified_attention_kernel: Callable[..., None] | None = None,
) -> Iterator[list[str]]:
    """Within the block, the references stand where vLLM imports the real kernels from, for each
    one that is absent; ``unified_attention_kernel`` (AITER's own, :mod:`.aiter_triton`) stands
    where given instead of its reference. Yields the names of the references installed."""
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
    try:
        with mock.patch.dict(sys.modules, modules):
            yield names
    finally:
        for library in libraries:
            library._destroy()
