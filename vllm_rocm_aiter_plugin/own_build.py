"""The plugin's own ``build()`` for ROCM_AITER_FA, used only on vLLM builds it was verified against.

What it replaces: the body of vLLM's ``AiterFlashAttentionMetadataBuilder.build`` in the releases
0.22.0-0.33.0 (seven distinct sources, recognised by a fingerprint of the source text, see
``VERIFIED_BUILD_FINGERPRINTS``; version differences are handled by feature detection).
On any other source the builder runs vLLM's own ``build()`` with the plugin's split instead.

Why it is faster, and which stock lines each part mirrors:
- split: :mod:`vllm_rocm_aiter_plugin.split` (Python ints, or numpy over zero-copy views) instead
  of stock's torch ops and ``.item()`` calls;
- query lengths and per-region maxima come from a numpy view of ``query_start_loc_cpu`` (stock:
  ``query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]`` and ``.max().item()`` per region), so a
  pure-decode batch allocates no host tensor at all;
- extend context chunks (stock: ``range_idx == cu_seq_lens_cpu[:, 1:][:, :, None]`` summed and
  cumsummed, a boolean tensor of [num_chunks, num_extends, max_cum_tokens]): each chunk's
  token-to-request map is a bincount of the chunk's request boundaries followed by a cumsum, O(tokens)
  time and memory instead of O(extends x tokens);
- stock's extend path computes a device ``cu_seq_lens`` that nothing reads; it is not computed here.
Everything else (sliding-window decode tables, fp8 scale tables, dataclasses, host-to-device copies)
calls vLLM's own methods and classes. Output equals what vLLM's ``build()`` gives with the same
split, field by field, dtype and device included (tests/test_builder.py,
tests/test_model_runner_v2.py, tests/gpu/test_builder_gpu.py).

Batches this path does not handle go to the stock logic: KV-sharing layers and the fp8 shuffle KV
cache layout (both rare, both with extra state in the builder).

Why it exists and when it can go: ``docs/deviations.md``, entry 7.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import textwrap
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.attention.backends import rocm_aiter_fa as aiter_fa
from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

from vllm_rocm_aiter_plugin.policy import switched_off
from vllm_rocm_aiter_plugin.split import split_decodes_prefills_and_extends

FAST_BUILD_ENV = "VLLM_ROCM_AITER_PLUGIN_FAST_BUILD"

VERIFIED_BUILD_FINGERPRINTS: dict[str, str] = {
    # sha256[:16] of the dedented source of AiterFlashAttentionMetadataBuilder.build -> the
    # releases that ship that source. Each entry is here because the differential tests passed
    # on those releases (README, "Tested releases"). 0.20.0-0.21.0 are not: their metadata also
    # carries host values of every sequence length (num_actual_kv_tokens, per-region minima).
    "47315118f14dbfc4": "0.22.0-0.22.1",
    "ab2125a990db7e9a": "0.23.0-0.25.1",
    "f3f7a92e8dfc52bf": "0.26.0-0.28.0",
    "b8a50bc1402ac5b5": "0.29.0",
    "b1ce8d5f4cce7fb6": "0.30.0-0.31.0",
    "57f58c56fc465096": "0.32.0",
    "01dedefe29a05505": "0.33.0",
}


def build_fingerprint(build: Callable[..., Any] = AiterFlashAttentionMetadataBuilder.build) -> str:
    """First 16 hex digits of the sha256 of the build() source (Python-version independent)."""
    source = textwrap.dedent(inspect.getsource(build))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def verified_release() -> str | None:
    """The releases whose build() source the installed vLLM has, if this path was verified on it."""
    try:
        return VERIFIED_BUILD_FINGERPRINTS.get(build_fingerprint())
    except (OSError, TypeError):  # no source available
        return None


_VERIFIED = verified_release()
_METADATA_FIELDS = frozenset(aiter_fa.AiterFlashAttentionMetadata.__dataclass_fields__)
_DECODE_FIELDS = frozenset(aiter_fa.AiterFlashAttentionDecodeMetadata.__dataclass_fields__)
_HAS_USE_CASCADE = "use_cascade" in _METADATA_FIELDS  # <= 0.29
_HAS_KV_SHARING = "kv_sharing_metadata" in _METADATA_FIELDS  # >= 0.30
_HAS_UNIFORM_QUERY_LEN = "uniform_query_len" in _DECODE_FIELDS  # 0.29


def enabled() -> bool:
    """Whether the own path may run: a verified build() source and not switched off (the kill
    switch's on/off vocabulary, :func:`policy.switched_off`). ``force`` runs it on an unverified
    source too: only ``scripts/verify_release.py`` does that, to verify a new release."""
    value = os.environ.get(FAST_BUILD_ENV)
    if value is not None and value.strip().lower() == "force":
        return True
    return _VERIFIED is not None and not switched_off(value)


def handles(builder: AiterFlashAttentionMetadataBuilder) -> bool:
    """Whether this builder has no state the own path does not reproduce (KV sharing); fixed once
    the builder is constructed."""
    return getattr(builder, "kv_sharing_workspace", None) is None


def handles_kv_layout() -> bool:
    """Whether vLLM's current KV-cache layout is one the own path handles (not the fp8 shuffle
    layout). A process-wide vLLM setting, read on every build as stock's build() does."""
    return not aiter_fa.rocm_aiter_ops.is_shuffle_kv_cache_enabled()


def _sync_allowed() -> contextlib.AbstractContextManager[Any]:
    allowed = getattr(aiter_fa, "gpu_sync_allowed", None)  # newer vLLM only
    return allowed() if allowed is not None else contextlib.nullcontext()


def build(
    builder: AiterFlashAttentionMetadataBuilder,
    common_prefix_len: int,
    common_attn_metadata: CommonAttentionMetadata,
) -> aiter_fa.AiterFlashAttentionMetadata:
    """Metadata equal to stock ``build()``'s, computed with the plugin's faster host code."""
    cam = common_attn_metadata
    if hasattr(builder, "_build_asm_kv_scale_tables"):
        builder._build_asm_kv_scale_tables()
    (num_decodes, num_extends, num_prefills, num_decode_tokens, num_extend_tokens, _) = (
        split_decodes_prefills_and_extends(cam, decode_threshold=builder.reorder_batch_threshold)
    )
    qsl = cam.query_start_loc_cpu.numpy()
    seq_lens_host = None
    if num_prefills or num_extends:
        query_lens = qsl[1:] - qsl[:-1]
        with _sync_allowed():
            seq_lens_host = cam.seq_lens.cpu()

    decode_metadata = None
    if num_decodes:
        if num_decodes == cam.num_reqs:
            decode_max_query_len = _pure_decode_max_query_len(qsl)
        else:
            decode_max_query_len = int(query_lens[:num_decodes].max())
        decode_metadata = _decode_metadata(
            builder, cam, num_decodes, num_decode_tokens, decode_max_query_len
        )
    prefill_metadata = None
    if num_prefills:
        start = num_decodes + num_extends
        query_start_loc = cam.query_start_loc[start:]
        prefill_metadata = aiter_fa.AiterFlashAttentionPrefillMetadata(
            max_query_len=int(query_lens[start:].max()),
            max_seq_len=int(seq_lens_host[start:].max()),
            query_start_loc=query_start_loc - query_start_loc[0],
        )
    extend_metadata = None
    if num_extends:
        extend_metadata = _extend_metadata(
            builder, cam, num_decodes, num_extends, query_lens, seq_lens_host
        )

    extra: dict[str, Any] = {}
    if _HAS_USE_CASCADE:
        extra["use_cascade"] = common_prefix_len > 0
    if _HAS_KV_SHARING:  # this path only runs without KV sharing
        extra["kv_sharing_metadata"] = None
    if hasattr(builder, "k_scale"):
        k_scale, v_scale = builder.k_scale, builder.v_scale
    else:  # <= 0.32 keeps one scale for both
        k_scale = v_scale = builder.scale
    return aiter_fa.AiterFlashAttentionMetadata(
        num_actual_tokens=cam.num_actual_tokens,
        query_start_loc=cam.query_start_loc,
        max_seq_len=cam.max_seq_len,
        seq_lens=cam.seq_lens,
        block_table=cam.block_table_tensor,
        causal=cam.causal,
        slot_mapping=cam.slot_mapping,
        num_decodes=num_decodes,
        num_decode_tokens=num_decode_tokens,
        num_prefills=num_prefills,
        num_extends=num_extends,
        num_extend_tokens=num_extend_tokens,
        decode_metadata=decode_metadata,
        prefill_metadata=prefill_metadata,
        extend_metadata=extend_metadata,
        k_scale=k_scale,
        v_scale=v_scale,
        **extra,
    )


def _pure_decode_max_query_len(qsl: np.ndarray) -> int:
    """Longest query of an all-decode batch, read from the offsets as stock does (``max_query_len``
    is not trusted: a caller may understate it, and stock's metadata then carries the real one)."""
    query_lens = qsl[1:] - qsl[:-1]
    return query_lens.item(query_lens.argmax())


def _decode_metadata(
    builder: AiterFlashAttentionMetadataBuilder,
    cam: CommonAttentionMetadata,
    num_decodes: int,
    num_decode_tokens: int,
    max_query_len: int,
) -> aiter_fa.AiterFlashAttentionDecodeMetadata:
    if _HAS_UNIFORM_QUERY_LEN:
        uniform = max_query_len if num_decode_tokens == num_decodes * max_query_len else None
        return aiter_fa.AiterFlashAttentionDecodeMetadata(
            max_query_len=max_query_len, uniform_query_len=uniform
        )
    if not hasattr(builder, "_build_swa_decode_tables"):  # <= 0.32
        return aiter_fa.AiterFlashAttentionDecodeMetadata(max_query_len=max_query_len)
    swa_block_table, swa_seq_lens, swa_max_seq_len = None, None, 0
    if max_query_len == 1:
        swa_block_table, swa_seq_lens, swa_max_seq_len = builder._build_swa_decode_tables(
            cam.block_table_tensor, cam.seq_lens, num_decodes, cam.max_seq_len
        )
    return aiter_fa.AiterFlashAttentionDecodeMetadata(
        max_query_len=max_query_len,
        swa_block_table=swa_block_table,
        swa_seq_lens=swa_seq_lens,
        swa_max_seq_len=swa_max_seq_len,
    )


@functools.cache
def _pin() -> bool:
    from vllm.utils.platform_utils import is_pin_memory_available

    return is_pin_memory_available()


def _to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Asynchronous host-to-device copy, staged through pinned memory where there is any."""
    if device.type == "cpu":
        return host
    if _pin() and not host.is_pinned():
        host = torch.empty(host.shape, dtype=host.dtype, pin_memory=True).copy_(host)
    return host.to(device, non_blocking=True)


def _extend_metadata(
    builder: AiterFlashAttentionMetadataBuilder,
    cam: CommonAttentionMetadata,
    num_decodes: int,
    num_extends: int,
    all_query_lens: np.ndarray,
    seq_lens_host: torch.Tensor,
) -> aiter_fa.AiterFlashAttentionChunkPrefillMetadata:
    device = builder.device
    rows = slice(num_decodes, num_decodes + num_extends)
    query_lens = torch.from_numpy(all_query_lens[rows])  # same dtype as query_start_loc_cpu
    seq_lens = seq_lens_host[rows]
    context_lens = seq_lens - query_lens
    pin = _pin()

    swa_metadata = None
    if builder.aot_sliding_window is not None:
        swa_lens = torch.minimum(seq_lens, query_lens + builder.aot_sliding_window[0] + 1)
        swa_cu = torch.zeros(num_extends + 1, dtype=torch.int32, pin_memory=pin)
        torch.cumsum(swa_lens, dim=0, dtype=torch.int32, out=swa_cu[1:])
        total = int(swa_cu[-1])
        token_to_seq = torch.repeat_interleave(
            torch.arange(num_extends, dtype=torch.int32), swa_lens
        )
        swa_metadata = aiter_fa.AiterChunkSlidingWindowMetadata(
            swa_cu_seqlens=swa_cu.to(device, non_blocking=True),
            swa_seq_starts=_to_device(seq_lens - swa_lens, device),
            swa_token_to_batch=_to_device(token_to_seq, device),
            swa_max_seqlens=int(swa_lens.max()),
            swa_total_tokens=total,
            swa_workspace=torch.empty(
                (2, total, builder.num_heads_kv, builder.headdim),
                dtype=builder.vllm_config.model_config.dtype,
                device=device,
            ),
        )

    chunk_capacity = aiter_fa._CP_TOKENS_PER_ITER_ROCM // num_extends
    num_chunks = -(-int(context_lens.max()) // chunk_capacity)
    chunk_starts = (
        torch.arange(num_chunks, dtype=torch.int32).unsqueeze(1).expand(-1, num_extends)
        * chunk_capacity
    )
    chunk_lens = (
        torch.minimum(context_lens.unsqueeze(0), chunk_starts + chunk_capacity) - chunk_starts
    )
    chunk_lens.clamp_(min=0)  # [num_chunks, num_extends]
    cu_chunk = torch.zeros([num_chunks, num_extends + 1], dtype=torch.int32, pin_memory=pin)
    torch.cumsum(chunk_lens, dim=1, dtype=torch.int32, out=cu_chunk[:, 1:])
    chunk_totals = cu_chunk[:, -1]
    width = int(chunk_totals.max()) if num_chunks else 0
    chunk_context = aiter_fa.AiterChunkContextMetadata(
        workspace=builder.extend_workspace,
        cu_seq_lens_chunk=cu_chunk.to(device, non_blocking=True),
        chunk_starts=_to_device(chunk_starts, device),
        token_to_batch=_to_device(_token_to_request(cu_chunk, width), device),
        max_seq_lens=chunk_lens.max(dim=1).values.tolist(),
        num_chunks=num_chunks,
        total_token_per_batch=chunk_totals.tolist(),
        swa_metadata=swa_metadata,
    )
    query_start_loc = cam.query_start_loc[num_decodes : num_decodes + num_extends + 1]
    return aiter_fa.AiterFlashAttentionChunkPrefillMetadata(
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        query_start_loc=query_start_loc - query_start_loc[0],
        chunk_context_metadata=chunk_context,
    )


def _token_to_request(cu_chunk: torch.Tensor, width: int) -> torch.Tensor:
    """[num_chunks, width] int64: for chunk c and workspace token t, how many of the chunk's requests
    end at or before t, i.e. the request the token belongs to. O(num_chunks x (requests + width))."""
    num_chunks = cu_chunk.shape[0]
    ends = cu_chunk[:, 1:].numpy().astype(np.int64)
    rows = np.broadcast_to(np.arange(num_chunks, dtype=np.int64)[:, None], ends.shape)
    inside = ends < width
    counts = np.bincount((rows * width + ends)[inside], minlength=num_chunks * width)
    return torch.from_numpy(np.cumsum(counts.reshape(num_chunks, width), axis=1, dtype=np.int64))
