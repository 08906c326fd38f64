"""Decode / extend / prefill split of a reordered batch, safe for pure-decode EAGLE batches.

Replaces ``vllm.v1.attention.backends.utils.split_decodes_prefills_and_extends`` for the
ROCM_AITER_FA builder. Why: in vLLM 0.20.0-0.23.0 the stock function asserts
``seq_lens_cpu_upper_bound is not None`` before its pure-decode early return, and model-runner V2
builds EAGLE pure-decode metadata without that field, so ROCm users crash with ``AssertionError``.
Upstream fixed it in vLLM 0.24.0 (PR #44936) by returning early first. Removal: once the oldest vLLM
this plugin supports is 0.24.0 or newer, the split can go (the speed-up aside, see benchmarks/).

Differences from stock, all deliberate:
- counts are Python ints (stock returns 0-dim tensors for token counts when a prefill is present);
- a mixed batch without ``seq_lens_cpu_upper_bound`` falls back to the exact ``seq_lens`` (one
  device-to-host copy, one WARNING per process) instead of asserting;
- malformed batches raise ``ValueError`` naming the field and row instead of giving silent garbage;
- ``max_query_len > decode_threshold`` with no row above the threshold gives "all decodes" (stock
  returns all zeros, dropping every request);
- the mixed path works on zero-copy numpy views of the host tensors (6-8x faster than stock).

Batch layout expected (vLLM's ``reorder_batch_to_split_decodes_and_prefills``):
decode -> short extend -> long extend -> prefill. Rows up to the first row whose query is longer than
the threshold are decodes (short extends included); from there up to the first such row with no
context are extends; the rest are prefills (short prompts with no context may sit anywhere there).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

SplitCounts = tuple[int, int, int, int, int, int]

_warned_lock = threading.Lock()
_warned_missing_upper_bound = False


def split_decodes_prefills_and_extends(
    common_attn_metadata: CommonAttentionMetadata,
    decode_threshold: int = 1,
) -> SplitCounts:
    """Count decodes, extends and prefills of a reordered batch, and their tokens.

    Returns ``(num_decodes, num_extends, num_prefills, num_decode_tokens, num_extend_tokens,
    num_prefill_tokens)`` as Python ints. Padding tokens (``num_actual_tokens`` beyond the last
    query offset) are counted in the last non-empty group, as stock vLLM does.
    """
    if decode_threshold < 1:
        raise ValueError(f"decode_threshold must be >= 1, got {decode_threshold}")
    cam = common_attn_metadata
    num_reqs = cam.num_reqs
    query_start_loc = cam.query_start_loc_cpu
    if query_start_loc.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc_cpu has {query_start_loc.shape[0]} entries, "
            f"expected num_reqs + 1 = {num_reqs + 1}"
        )
    if cam.max_query_len <= decode_threshold:
        # Pure decode (incl. EAGLE/MTP spec tokens): nothing to read, no tensor op, no host sync.
        return num_reqs, 0, 0, cam.num_actual_tokens, 0, 0
    return _split_mixed(cam, decode_threshold)


def _split_mixed(cam: CommonAttentionMetadata, threshold: int) -> SplitCounts:
    num_reqs = cam.num_reqs
    num_tokens = cam.num_actual_tokens
    qsl = _host_int64(cam.query_start_loc_cpu)
    query_lens = np.diff(qsl)
    if qsl[0] != 0:
        raise ValueError(f"query_start_loc_cpu must start at 0, got {int(qsl[0])}")
    if num_reqs and query_lens.min() < 0:
        row = int(np.argmax(query_lens < 0))
        raise ValueError(
            f"query_start_loc_cpu decreases at request {row}: "
            f"{int(qsl[row])} -> {int(qsl[row + 1])}"
        )

    long_query = query_lens > threshold
    if not long_query.any():
        return num_reqs, 0, 0, num_tokens, 0, 0
    num_decodes = int(np.argmax(long_query))
    num_decode_tokens = int(qsl[num_decodes])

    seq_lens = _host_int64(_host_seq_lens(cam))
    if seq_lens.shape[0] < num_reqs:
        raise ValueError(
            f"seq_lens has {seq_lens.shape[0]} entries, expected at least num_reqs = {num_reqs}"
        )
    seq_lens = seq_lens[:num_reqs]
    short_seq = seq_lens < query_lens
    if short_seq.any():
        row = int(np.argmax(short_seq))
        raise ValueError(
            f"seq_lens[{row}] = {int(seq_lens[row])} is smaller than its query length "
            f"{int(query_lens[row])}"
        )
    is_prefill = long_query & (seq_lens == query_lens)
    if not is_prefill.any():
        return (
            num_decodes,
            num_reqs - num_decodes,
            0,
            num_decode_tokens,
            num_tokens - num_decode_tokens,
            0,
        )
    first_prefill = int(np.argmax(is_prefill))
    has_context = seq_lens[first_prefill:] > query_lens[first_prefill:]
    if has_context.any():
        row = first_prefill + int(np.argmax(has_context))
        raise ValueError(
            f"request {row} has context (seq_lens {int(seq_lens[row])} > query length "
            f"{int(query_lens[row])}) but comes after the first prefill (request "
            f"{first_prefill}); the prefill path would ignore its context. "
            "Reorder the batch: decode -> extend -> prefill."
        )
    prefill_start_token = int(qsl[first_prefill])
    return (
        num_decodes,
        first_prefill - num_decodes,
        num_reqs - first_prefill,
        num_decode_tokens,
        prefill_start_token - num_decode_tokens,
        num_tokens - prefill_start_token,
    )


def _host_seq_lens(cam: CommonAttentionMetadata) -> torch.Tensor:
    """Host sequence lengths for the mixed path: the upper bound when present, else exact lens."""
    upper_bound = getattr(cam, "seq_lens_cpu_upper_bound", None)
    if upper_bound is not None:
        return upper_bound
    _warn_missing_upper_bound_once()
    return cam.seq_lens.cpu()


def _warn_missing_upper_bound_once() -> None:
    global _warned_missing_upper_bound
    with _warned_lock:
        if _warned_missing_upper_bound:
            return
        _warned_missing_upper_bound = True
    from vllm.logger import init_logger

    from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

    init_logger(LOGGER_NAME).warning(
        "ROCM_AITER_FA split: a mixed batch came without seq_lens_cpu_upper_bound; using the "
        "exact seq_lens instead (one device-to-host copy per such batch). Stock vLLM "
        "0.20.0-0.23.0 would have raised AssertionError here."
    )


def _host_int64(tensor: torch.Tensor) -> np.ndarray:
    """A numpy view (zero-copy for int64) of a host tensor, widened to int64."""
    array = tensor.numpy() if tensor.device.type == "cpu" else tensor.cpu().numpy()
    return array.astype(np.int64, copy=False)
