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
- the mixed path reads Python ints (up to ``SMALL_BATCH`` requests) or zero-copy numpy views of the
  host tensors, with no torch op: about 5-18x faster than stock (``benchmarks/bench_builder.py``).

Batch layout expected (vLLM's ``reorder_batch_to_split_decodes_and_prefills``):
decode -> short extend -> long extend -> prefill. Rows up to the first row whose query is longer than
the threshold are decodes (short extends included); from there up to the first such row with no
context are extends; the rest are prefills (short prompts with no context may sit anywhere there).
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
    if cam.num_reqs <= SMALL_BATCH:
        return _split_small(cam, decode_threshold)
    return _split_mixed(cam, decode_threshold)


SMALL_BATCH = 24
"""Up to this many requests Python ints beat numpy's fixed per-call overhead (measured)."""


def _split_small(cam: CommonAttentionMetadata, threshold: int) -> SplitCounts:
    """The mixed path over Python ints; the same results and errors as :func:`_split_mixed`."""
    num_reqs = cam.num_reqs
    num_tokens = cam.num_actual_tokens
    qsl = cam.query_start_loc_cpu.tolist()
    _check_offsets(len(qsl), num_reqs, qsl[0] if qsl else None)
    num_decodes = -1
    for row in range(num_reqs):
        query_len = qsl[row + 1] - qsl[row]
        if query_len > threshold:
            if num_decodes < 0:
                num_decodes = row
        elif query_len < 0:
            _raise_first_invalid_row(qsl, [])
    if num_decodes < 0:
        return num_reqs, 0, 0, num_tokens, 0, 0

    seq_lens = _host_seq_lens(cam).tolist()
    _check_seq_lens_length(len(seq_lens), num_reqs)
    first_prefill = -1
    start = 0
    for row in range(num_reqs):
        end = qsl[row + 1]
        query_len = end - start
        start = end
        context_len = seq_lens[row] - query_len
        if context_len < 0:
            _raise_first_invalid_row(qsl, seq_lens)
        if first_prefill < 0:
            if not context_len and query_len > threshold:
                first_prefill = row
        elif context_len:
            _raise_first_invalid_row(qsl, seq_lens, first_prefill)
    prefill_start = qsl[first_prefill] if first_prefill >= 0 else None
    return _counts(
        num_reqs, num_tokens, num_decodes, qsl[num_decodes], first_prefill, prefill_start
    )


def _split_mixed(cam: CommonAttentionMetadata, threshold: int) -> SplitCounts:
    """The mixed path over zero-copy numpy views: about ten numpy calls whatever the batch size.

    Reductions go through ``argmin``/``argmax``/``count_nonzero`` (C calls) rather than
    ``min``/``any`` (Python-level wrappers, 3x the fixed cost on small arrays); ``argmin`` of the
    context lengths gives both their sign check and the first row without context.
    """
    num_reqs = cam.num_reqs
    num_tokens = cam.num_actual_tokens
    qsl = cam.query_start_loc_cpu.numpy()  # zero-copy view; the tensor is on the host by contract
    if qsl.shape[0] != num_reqs + 1 or not num_reqs or qsl.item(0):
        _check_offsets(qsl.shape[0], num_reqs, qsl.item(0) if qsl.shape[0] else None)
        return 0, 0, 0, num_tokens, 0, 0
    query_lens = qsl[1:] - qsl[:-1]
    if query_lens.item(0) > threshold:
        num_decodes = 0
    else:
        long_query = query_lens > _as_array(threshold, query_lens.dtype)
        num_decodes = int(long_query.argmax())
        if not long_query[num_decodes]:
            if query_lens.item(query_lens.argmin()) < 0:
                _raise_first_invalid_row(qsl.tolist(), [])
            return num_reqs, 0, 0, num_tokens, 0, 0

    seq_lens = _host_seq_lens(cam).numpy()
    if seq_lens.shape[0] < num_reqs:
        _check_seq_lens_length(seq_lens.shape[0], num_reqs)
    context_lens = seq_lens[:num_reqs] - query_lens
    first_prefill = int(context_lens.argmin())  # the first row without context, if any
    least_context = context_lens.item(first_prefill)
    if least_context < 0 or query_lens.item(query_lens.argmin()) < 0:
        _raise_first_invalid_row(qsl.tolist(), seq_lens.tolist())
    num_decode_tokens = qsl.item(num_decodes)
    if least_context:  # every row has context: no prefill
        return _counts(num_reqs, num_tokens, num_decodes, num_decode_tokens, -1, None)
    if query_lens.item(first_prefill) <= threshold:  # a short row without context (a decode or a
        # short prompt): the first prefill is the first long row without context from there
        is_prefill = (context_lens[first_prefill:] == 0) & (query_lens[first_prefill:] > threshold)
        offset = int(is_prefill.argmax())
        if not is_prefill[offset]:
            return _counts(num_reqs, num_tokens, num_decodes, num_decode_tokens, -1, None)
        first_prefill += offset
    if np.count_nonzero(context_lens[first_prefill:]):
        _raise_first_invalid_row(qsl.tolist(), seq_lens.tolist(), first_prefill)
    return _counts(
        num_reqs,
        num_tokens,
        num_decodes,
        num_decode_tokens,
        first_prefill,
        qsl.item(first_prefill),
    )


_SCALARS: dict[tuple[int, np.dtype], np.ndarray] = {}


def _as_array(value: int, dtype: np.dtype) -> np.ndarray:
    """``value`` as a 0-d array of ``dtype``, cached: comparing an array with a Python int makes
    numpy convert the int on every call (half the cost of the comparison on small arrays)."""
    scalar = _SCALARS.get((value, dtype))
    if scalar is None:
        scalar = _SCALARS.setdefault((value, dtype), np.array(value, dtype=dtype))
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


def _check_offsets(length: int, num_reqs: int, first: int | None) -> None:
    if length != num_reqs + 1:
        raise ValueError(
            f"query_start_loc_cpu has {length} entries, expected num_reqs + 1 = {num_reqs + 1}"
        )
    if first != 0:
        raise ValueError(f"query_start_loc_cpu must start at 0, got {first}")


def _check_seq_lens_length(length: int, num_reqs: int) -> None:
    if length < num_reqs:
        raise ValueError(f"seq_lens has {length} entries, expected at least num_reqs = {num_reqs}")


def _raise_first_invalid_row(
    qsl: list[int], seq_lens: list[int], first_prefill: int | None = None
) -> NoReturn:
    """Raise for the first malformed row, in one order for both paths.

    Checks, in order: offsets that decrease; sequences shorter than their query (when
    ``seq_lens`` is given); context after ``first_prefill`` (when given).
    """
    query_lens = [end - start for start, end in pairwise(qsl)]
    for row, query_len in enumerate(query_lens):
        if query_len < 0:
            raise ValueError(
                f"query_start_loc_cpu decreases at request {row}: {qsl[row]} -> {qsl[row + 1]}"
            )
    for row, (seq_len, query_len) in enumerate(zip(seq_lens, query_lens, strict=False)):
        if seq_len < query_len:
            raise ValueError(
                f"seq_lens[{row}] = {seq_len} is smaller than its query length {query_len}"
            )
    if first_prefill is not None:
        for row in range(first_prefill, len(query_lens)):
            if seq_lens[row] > query_lens[row]:
                raise ValueError(
                    f"request {row} has context (seq_lens {seq_lens[row]} > query length "
                    f"{query_lens[row]}) but comes after the first prefill (request "
                    f"{first_prefill}); the prefill path would ignore its context. Reorder the "
                    "batch: decode -> extend -> prefill."
                )
    raise AssertionError("no malformed row found")  # callers only come here after a failed check


def _host_seq_lens(cam: CommonAttentionMetadata) -> torch.Tensor:
    """Host sequence lengths for the mixed path: the upper bound when present, else exact lens
    (copied to the host)."""
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
