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
    if cam.max_query_len <= decode_threshold:
        # Pure decode (incl. EAGLE/MTP spec tokens): nothing to read, no tensor op, no host sync.
        return cam.num_reqs, 0, 0, cam.num_actual_tokens, 0, 0
    return _split_mixed(cam, decode_threshold)


def _split_mixed(cam: CommonAttentionMetadata, threshold: int) -> SplitCounts:
    num_reqs = cam.num_reqs
    num_tokens = cam.num_actual_tokens
    qsl = _host_array(cam.query_start_loc_cpu)
    if qsl.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc_cpu has {qsl.shape[0]} entries, expected num_reqs + 1 = {num_reqs + 1}"
        )
    if qsl[0] != 0:
        raise ValueError(f"query_start_loc_cpu must start at 0, got {int(qsl[0])}")
    query_lens = qsl[1:] - qsl[:-1]
    long_query = query_lens > threshold
    num_decodes = int(long_query.argmax()) if num_reqs else 0
    if not num_reqs or not long_query[num_decodes]:
        _check_query_lens(qsl, query_lens)
        return num_reqs, 0, 0, num_tokens, 0, 0

    seq_lens = _host_array(_host_seq_lens(cam))
    if seq_lens.shape[0] < num_reqs:
        raise ValueError(
            f"seq_lens has {seq_lens.shape[0]} entries, expected at least num_reqs = {num_reqs}"
        )
    context_lens = seq_lens[:num_reqs] - query_lens
    if np.minimum(query_lens, context_lens).min() < 0:  # one pass for both checks
        _check_query_lens(qsl, query_lens)
        row = int((context_lens < 0).argmax())
        raise ValueError(
            f"seq_lens[{row}] = {int(seq_lens[row])} is smaller than its query length "
            f"{int(query_lens[row])}"
        )
    num_decode_tokens = int(qsl[num_decodes])
    is_prefill = long_query & (context_lens == 0)
    first_prefill = int(is_prefill.argmax())
    if not is_prefill[first_prefill]:
        return (
            num_decodes,
            num_reqs - num_decodes,
            0,
            num_decode_tokens,
            num_tokens - num_decode_tokens,
            0,
        )
    after = context_lens[first_prefill:]
    if after.any():
        row = first_prefill + int((after > 0).argmax())
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


def _check_query_lens(qsl: np.ndarray, query_lens: np.ndarray) -> None:
    """Raise if ``query_start_loc_cpu`` decreases anywhere."""
    if query_lens.size and query_lens.min() < 0:
        row = int((query_lens < 0).argmax())
        raise ValueError(
            f"query_start_loc_cpu decreases at request {row}: {int(qsl[row])} -> {int(qsl[row + 1])}"
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


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    """A zero-copy numpy view of a host tensor (a copy only if it is not on the host)."""
    try:
        return tensor.numpy()
    except TypeError:  # not on the host
        return tensor.cpu().numpy()
