"""Decode / extend / prefill split for ROCM_AITER_FA, right for V1 and model-runner V2 batch order."""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

SplitCounts = tuple[int, int, int, int, int, int]


@dataclass(slots=True)  # not frozen: creating a frozen one is a measurable share of a build
class BatchSplit:
    """The regions of one batch, and the host arrays they were decided from."""

    num_decodes: int
    num_extends: int
    num_prefills: int
    num_decode_tokens: int
    num_extend_tokens: int
    num_prefill_tokens: int
    query_lens: np.ndarray | None = None
    seq_lens: torch.Tensor | None = None
    exposed_requests: int = 0  # rows stock's own split would serve without their context
    exposed_context_tokens: int = 0  # the cached tokens those rows would not attend

    @property
    def counts(self) -> SplitCounts:
        """The six counts in the order stock's split returns them."""
        return (
            self.num_decodes,
            self.num_extends,
            self.num_prefills,
            self.num_decode_tokens,
            self.num_extend_tokens,
            self.num_prefill_tokens,
        )


def split_decodes_prefills_and_extends(
    common_attn_metadata: CommonAttentionMetadata,
    decode_threshold: int = 1,
) -> SplitCounts:
    """Stock's signature and return shape (Python ints) over :func:`split_batch`: what vLLM's own
    ``build()`` body calls when the plugin runs it (``docs/deviations.md``, "builder: vLLM's
    build() code")."""
    cam = common_attn_metadata
    # split_batch's pure-decode rule, answered here without building a BatchSplit: the commonest
    # step in serving, where building that object is a measurable share of a short build().
    if decode_threshold >= 1 and cam.max_query_len <= decode_threshold:
        return cam.num_reqs, 0, 0, cam.num_actual_tokens, 0, 0
    return split_batch(cam, decode_threshold).counts


def split_batch(cam: CommonAttentionMetadata, threshold: int) -> BatchSplit:
    """Split ``cam`` into decodes, extends and prefills at ``threshold``."""
    if threshold < 1:
        raise ValueError(f"decode_threshold must be >= 1, got {threshold}")
    num_reqs, num_tokens = cam.num_reqs, cam.num_actual_tokens
    if cam.max_query_len <= threshold:
        # Pure decode (incl. EAGLE/MTP spec tokens): nothing to read, no tensor op, no host sync.
        return BatchSplit(num_reqs, 0, 0, num_tokens, 0, 0)

    qsl = cam.query_start_loc_cpu.numpy()  # zero-copy view; the tensor is on the host by contract
    if qsl.ndim != 1 or qsl.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc_cpu must be 1-D with num_reqs + 1 = {num_reqs + 1} entries, got "
            f"shape {qsl.shape}"
        )
    if qsl.item(0):
        raise ValueError(f"query_start_loc_cpu must start at 0, got {qsl.item(0)}")
    query_lens = qsl[1:] - qsl[:-1]
    if num_reqs and query_lens.item(query_lens.argmin()) < 0:
        row = int(np.flatnonzero(query_lens < 0)[0])
        raise ValueError(
            f"query_start_loc_cpu decreases at request {row}: {qsl.item(row)} -> "
            f"{qsl.item(row + 1)}"
        )
    if qsl.item(-1) > num_tokens:
        raise ValueError(
            f"num_actual_tokens = {num_tokens} is smaller than the last query offset {qsl.item(-1)}"
        )
    is_long = query_lens > _scalar(threshold, query_lens.dtype)
    first_long = int(is_long.argmax()) if num_reqs else 0
    if not num_reqs or not is_long.item(first_long):
        return BatchSplit(num_reqs, 0, 0, num_tokens, 0, 0, query_lens)

    seq_lens = exact_host_seq_lens(cam)
    seq = seq_lens.numpy()
    if seq.ndim != 1 or seq.shape[0] < num_reqs:
        raise ValueError(
            f"seq_lens must be 1-D with at least num_reqs = {num_reqs} entries, got shape "
            f"{seq.shape}"
        )
    context_lens = seq[:num_reqs] - query_lens
    if context_lens.item(context_lens.argmin()) < 0:
        row = int(np.flatnonzero(context_lens < 0)[0])
        raise ValueError(
            f"seq_lens[{row}] = {int(seq_lens[row])} is smaller than its query length "
            f"{query_lens.item(row)}"
        )
    # The last row with context is the first of the reversed rows; argmax and item are C calls,
    # cheaper than any() on small arrays.
    from_end = (context_lens > _scalar(0, context_lens.dtype))[::-1]
    last = int(from_end.argmax())
    last_context = num_reqs - 1 - last if from_end.item(last) else -1
    exposed, unattended = (
        _stock_exposure(cam, query_lens, is_long, context_lens)
        if last_context >= first_long  # else no row with context where stock's region can start
        else (0, 0)
    )
    if getattr(cam, "causal", True):
        start, prefill_row = max(first_long, last_context + 1), is_long
    else:
        # A non-causal batch (0.33): the extend path runs causally whatever the batch says, so no
        # row is better served there; stock's regions (the first long row without context).
        start, prefill_row = first_long, is_long & (context_lens == _scalar(0, context_lens.dtype))
    first_prefill = num_reqs
    if start < num_reqs:
        offset = int(prefill_row[start:].argmax())
        if prefill_row.item(start + offset):
            first_prefill = start + offset
    decode_tokens = qsl.item(first_long)
    if first_prefill == num_reqs:  # no prefill: padding tokens go to the extends
        return BatchSplit(
            first_long, num_reqs - first_long, 0,
            decode_tokens, num_tokens - decode_tokens, 0,
            query_lens, seq_lens, exposed, unattended,
        )  # fmt: skip
    prefill_start = qsl.item(first_prefill)
    return BatchSplit(
        first_long, first_prefill - first_long, num_reqs - first_prefill,
        decode_tokens, prefill_start - decode_tokens, num_tokens - prefill_start,
        query_lens, seq_lens, exposed, unattended,
    )  # fmt: skip


def _stock_exposure(
    cam: CommonAttentionMetadata,
    query_lens: np.ndarray,
    is_long: np.ndarray,
    context_lens: np.ndarray,
) -> tuple[int, int]:
    """The rows stock's own split puts in its prefill region although they have context, and the
    cached tokens they would not attend. Stock's rule (every release 0.20.0-0.34.0): the region
    starts at the first long row whose ``seq_lens_cpu_upper_bound`` equals its query length. Not
    counted: a causal batch only (on a non-causal one neither region is right for such a row,
    ``docs/upstream/README.md``), and none without the upper bound (stock's split asserts it)."""
    bound = getattr(cam, "seq_lens_cpu_upper_bound", None)
    if bound is None or not getattr(cam, "causal", True):
        return 0, 0
    in_prefill = is_long & (bound.numpy()[: query_lens.shape[0]] == query_lens)
    first = int(in_prefill.argmax())
    if not in_prefill.item(first):
        return 0, 0
    lost = context_lens[first:]  # never negative (checked): the rows without context add 0
    exposed = int(np.count_nonzero(lost))
    return (exposed, int(lost.sum())) if exposed else (0, 0)  # the sum only where it counts


def exact_host_seq_lens(cam: CommonAttentionMetadata) -> torch.Tensor:
    """The exact sequence lengths on the host: ``cam.seq_lens`` itself when it already is, else one
    device-to-host copy (inside vLLM's ``gpu_sync_allowed()`` where the release has it)."""
    seq_lens = cam.seq_lens
    if seq_lens.is_cpu:
        return seq_lens
    with _sync_allowed():
        return seq_lens.cpu()


_SCALARS: dict[tuple[int, Any], np.ndarray] = {}


def _scalar(value: int, dtype: Any) -> np.ndarray:
    """``value`` as a cached 0-d array of ``dtype``, clamped to its range (a threshold beyond it
    means "no query is longer"): comparing an array with a Python int makes numpy convert the int
    on every call, a large share of the comparison on small arrays."""
    scalar = _SCALARS.get((value, dtype))
    if scalar is None:
        clamped = min(value, int(np.iinfo(dtype).max))
        scalar = _SCALARS.setdefault((value, dtype), np.array(clamped, dtype=dtype))
    return scalar


def _sync_allowed() -> contextlib.AbstractContextManager[Any]:
    allowed = _gpu_sync_allowed()
    return allowed() if allowed is not None else contextlib.nullcontext()


@functools.cache
def _gpu_sync_allowed() -> Any:
    """vLLM's ``gpu_sync_allowed`` (0.29 onwards: a debug mode flags device-to-host copies made
    outside it), or None on releases without it."""
    try:
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed
    except ImportError:
        return None
    return gpu_sync_allowed
