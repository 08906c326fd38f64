"""Independent oracle for the decode / extend / prefill split, written from vLLM's documented rules.

Plain Python over lists (no numpy, no torch, no plugin code), walking the reordered batch row by
row: decodes are the rows before the first query longer than the threshold; extends run from there
to the first such row without context; the rest are prefills. Padding tokens (``num_actual_tokens``
past the last offset) belong to the last non-empty group.
"""

from __future__ import annotations

from collections.abc import Sequence


def oracle_split(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    num_actual_tokens: int,
    threshold: int,
    max_query_len: int | None = None,
) -> tuple[int, int, int, int, int, int]:
    n = len(query_lens)
    if max_query_len is None:
        max_query_len = max(query_lens, default=0)
    if max_query_len <= threshold or all(q <= threshold for q in query_lens):
        return n, 0, 0, num_actual_tokens, 0, 0
    first_long = 0
    while query_lens[first_long] <= threshold:
        first_long += 1
    first_prefill = first_long
    while first_prefill < n and not (
        query_lens[first_prefill] > threshold
        and seq_lens[first_prefill] == query_lens[first_prefill]
    ):
        first_prefill += 1
    decode_tokens = sum(query_lens[:first_long])
    extend_tokens = sum(query_lens[first_long:first_prefill])
    prefill_tokens = sum(query_lens[first_prefill:])
    padding = num_actual_tokens - (decode_tokens + extend_tokens + prefill_tokens)
    if first_prefill < n:
        prefill_tokens += padding
    else:
        extend_tokens += padding
    return (
        first_long,
        first_prefill - first_long,
        n - first_prefill,
        decode_tokens,
        extend_tokens,
        prefill_tokens,
    )
