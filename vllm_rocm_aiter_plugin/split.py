"""Decode / extend / prefill split for ROCM_AITER_FA, right for V1 and model-runner V2 batch order.

Replaces ``vllm.v1.attention.backends.utils.split_decodes_prefills_and_extends`` for the plugin's
builder. Every way it differs from stock, with why and when it can go, is listed once in
``docs/deviations.md``, entries 1-6; this docstring only states the rule.

Regions, for a batch in any order vLLM's model runners produce:
- decodes: the rows before the first row whose query is longer than the threshold;
- prefills: from the first long row without context that comes after every row with context;
- extends: the rows in between (rows without context among them gather no context).
On a batch in V1 order (``reorder_batch_to_split_decodes_and_prefills``) these are stock's
regions. In model-runner V2 order (sorted by query length) a short new prompt can come before a
long row with context; stock then puts that row in the prefill region, whose kernel attends only
to the new tokens. Here no row with context is ever in the prefill region.

Pure-decode batches return before any tensor is read (no tensor op, no device-to-host copy).
Mixed batches read Python ints (up to ``SMALL_BATCH`` requests) or zero-copy numpy views of the
host tensors; both paths give the same counts and raise the same ``ValueError`` for the same
malformed input, checked in this order: the offsets' shape and first value, a decreasing offset,
``num_actual_tokens`` below the last offset, the sequence lengths' shape, a sequence shorter than
its query.
"""

from __future__ import annotations

import threading
from itertools import pairwise
from typing import TYPE_CHECKING, NoReturn

import numpy as np

if TYPE_CHECKING:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

SplitCounts = tuple[int, int, int, int, int, int]

SMALL_BATCH = 24
"""Up to this many requests Python ints beat numpy's fixed per-call overhead (measured by
``benchmarks/bench_builder.py``)."""

_warned_lock = threading.Lock()
_warned_missing_upper_bound = False


def split_decodes_prefills_and_extends(
    common_attn_metadata: CommonAttentionMetadata,
    decode_threshold: int = 1,
) -> SplitCounts:
    """Count decodes, extends and prefills of a batch, and their tokens.

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
    if cam.num_reqs <= SMALL_BATCH:
        return _split_small(cam, decode_threshold)
    return _split_mixed(cam, decode_threshold)


def _split_small(cam: CommonAttentionMetadata, threshold: int) -> SplitCounts:
    """The mixed path over Python ints; the same results and errors as :func:`_split_mixed`."""
    num_reqs = cam.num_reqs
    num_tokens = cam.num_actual_tokens
    qsl = cam.query_start_loc_cpu.tolist()
    if len(qsl) != num_reqs + 1 or qsl[0] != 0:
        _check_offsets(cam)
    query_lens = [end - start for start, end in pairwise(qsl)]
    first_long = -1
    for row, query_len in enumerate(query_lens):
        if query_len > threshold:
            first_long = row
            break
    if qsl[-1] > num_tokens or (query_lens and min(query_lens) < 0):
        _raise_first_error(qsl, num_tokens)
    if first_long < 0:
        return num_reqs, 0, 0, num_tokens, 0, 0

    seq_lens = _host_seq_lens(cam).tolist()
    if len(seq_lens) < num_reqs or type(seq_lens[0]) is not int:
        _check_seq_lens(cam, num_reqs)
    last_context = -1
    for row, query_len in enumerate(query_lens):
        context_len = seq_lens[row] - query_len
        if context_len:
            if context_len < 0:
                _raise_first_error(qsl, num_tokens, seq_lens)
            last_context = row
    first_prefill = -1
    for row in range(max(first_long, last_context + 1), num_reqs):
        if query_lens[row] > threshold:
            first_prefill = row
            break
    prefill_start = qsl[first_prefill] if first_prefill >= 0 else None
    return _counts(num_reqs, num_tokens, first_long, qsl[first_long], first_prefill, prefill_start)


def _split_mixed(cam: CommonAttentionMetadata, threshold: int) -> SplitCounts:
    """The mixed path over zero-copy numpy views: about a dozen numpy calls whatever the size.

    Reductions go through ``argmin``/``argmax`` (C calls) rather than ``min``/``any`` (Python-level
    wrappers with a larger fixed cost on small arrays); the last row with context is the first
    row with context of the reversed view (one code path for V1 and V2 order).
    """
    num_reqs = cam.num_reqs
    num_tokens = cam.num_actual_tokens
    qsl = cam.query_start_loc_cpu.numpy()  # zero-copy view; the tensor is on the host by contract
    if qsl.ndim != 1 or qsl.shape[0] != num_reqs + 1 or qsl.item(0):
        _check_offsets(cam)
    query_lens = qsl[1:] - qsl[:-1]
    if qsl.item(-1) > num_tokens or query_lens.item(query_lens.argmin()) < 0:
        _raise_first_error(qsl.tolist(), num_tokens)
    is_long = query_lens > _as_array(threshold, query_lens.dtype)
    first_long = int(is_long.argmax())
    if not is_long.item(first_long):
        return num_reqs, 0, 0, num_tokens, 0, 0

    seq_lens = _host_seq_lens(cam).numpy()
    if seq_lens.ndim != 1 or seq_lens.shape[0] < num_reqs:
        _check_seq_lens(cam, num_reqs)
    context_lens = seq_lens[:num_reqs] - query_lens
    start = int(context_lens.argmin())  # the first row with the least context
    least_context = context_lens.item(start)
    if least_context < 0:
        _raise_first_error(qsl.tolist(), num_tokens, seq_lens.tolist())
    first_prefill = -1
    if not least_context:  # some row has no context: prefills start after the last with context
        from_end = int(context_lens[::-1].astype(bool).argmax())
        if context_lens.item(-1 - from_end):
            start = num_reqs - from_end
        start = max(first_long, start)
        if start < num_reqs:
            offset = int(is_long[start:].argmax())
            if is_long.item(start + offset):
                first_prefill = start + offset
    prefill_start = qsl.item(first_prefill) if first_prefill >= 0 else None
    return _counts(
        num_reqs, num_tokens, first_long, qsl.item(first_long), first_prefill, prefill_start
    )


_SCALARS: dict[tuple[int, np.dtype], np.ndarray] = {}


def _as_array(value: int, dtype: np.dtype) -> np.ndarray:
    """``value`` as a 0-d array of ``dtype``, cached, clamped to the dtype's range (a threshold
    beyond it means "no query is longer"): comparing an array with a Python int makes numpy
    convert the int on every call (half the cost of the comparison on small arrays)."""
    scalar = _SCALARS.get((value, dtype))
    if scalar is None:
        clamped = min(value, int(np.iinfo(dtype).max))
        scalar = _SCALARS.setdefault((value, dtype), np.array(clamped, dtype=dtype))
    return scalar


def _counts(
    num_reqs: int,
    num_tokens: int,
    num_decodes: int,
    num_decode_tokens: int,
    first_prefill: int,
    prefill_start_token: int | None,
) -> SplitCounts:
    """The six counts from the two boundaries; padding tokens go to the last non-empty group."""
    if prefill_start_token is None:
        return (
            num_decodes,
            num_reqs - num_decodes,
            0,
            num_decode_tokens,
            num_tokens - num_decode_tokens,
            0,
        )
    return (
        num_decodes,
        first_prefill - num_decodes,
        num_reqs - first_prefill,
        num_decode_tokens,
        prefill_start_token - num_decode_tokens,
        num_tokens - prefill_start_token,
    )


def _check_offsets(cam: CommonAttentionMetadata) -> None:
    """Raise for offsets of the wrong shape or not starting at 0 (called once a cheap check
    failed)."""
    offsets = cam.query_start_loc_cpu
    if offsets.dim() != 1:
        raise ValueError(f"query_start_loc_cpu must be 1-D, got shape {tuple(offsets.shape)}")
    if offsets.shape[0] != cam.num_reqs + 1:
        raise ValueError(
            f"query_start_loc_cpu has {offsets.shape[0]} entries, expected num_reqs + 1 = "
            f"{cam.num_reqs + 1}"
        )
    if int(offsets[0]) != 0:
        raise ValueError(f"query_start_loc_cpu must start at 0, got {int(offsets[0])}")


def _check_seq_lens(cam: CommonAttentionMetadata, num_reqs: int) -> None:
    """Raise for host sequence lengths of the wrong shape (called once a cheap check failed)."""
    seq_lens = _host_seq_lens(cam)
    if seq_lens.dim() != 1:
        raise ValueError(f"seq_lens must be 1-D, got shape {tuple(seq_lens.shape)}")
    if seq_lens.shape[0] < num_reqs:
        raise ValueError(
            f"seq_lens has {seq_lens.shape[0]} entries, expected at least num_reqs = {num_reqs}"
        )


def _host_seq_lens(cam: CommonAttentionMetadata) -> torch.Tensor:
    """Host sequence lengths for the mixed path: the upper bound when present, else the exact
    lengths (copied to the host, with one WARNING per process)."""
    upper_bound = getattr(cam, "seq_lens_cpu_upper_bound", None)
    if upper_bound is not None:
        return upper_bound
    _warn_missing_upper_bound_once()
    return cam.seq_lens.cpu()


def _raise_first_error(
    qsl: list[int], num_tokens: int, seq_lens: list[int] | np.ndarray | None = None
) -> NoReturn:
    """Raise for the first problem, in one order for both paths: a decreasing offset,
    ``num_actual_tokens`` below the last offset, then (when ``seq_lens`` is given) a sequence
    shorter than its query."""
    query_lens = [end - start for start, end in pairwise(qsl)]
    for row, query_len in enumerate(query_lens):
        if query_len < 0:
            raise ValueError(
                f"query_start_loc_cpu decreases at request {row}: {qsl[row]} -> {qsl[row + 1]}"
            )
    if qsl[-1] > num_tokens:
        raise ValueError(
            f"num_actual_tokens = {num_tokens} is smaller than the last query offset {qsl[-1]}"
        )
    if seq_lens is not None:
        for row, query_len in enumerate(query_lens):
            if seq_lens[row] < query_len:
                raise ValueError(
                    f"seq_lens[{row}] = {seq_lens[row]} is smaller than its query length "
                    f"{query_len}"
                )
    raise AssertionError("no malformed row found")  # callers only come here after a failed check


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
