"""What a split's counts mean for each request: the one predicate for "this request loses its
context", shared by the probes, the serving trace, the forward cases and the tests."""

from __future__ import annotations

from collections.abc import Sequence


def context_rows_in_prefill(
    counts: Sequence[int], query_lens: Sequence[int], seq_lens: Sequence[int]
) -> list[int]:
    """Rows with context (``seq_len > query_len``) that ``counts`` (decodes, extends, prefills,
    ...) puts in the prefill region, whose kernel attends only to the row's new tokens."""
    first_prefill = int(counts[0]) + int(counts[1])
    return [row for row in range(first_prefill, len(query_lens)) if seq_lens[row] > query_lens[row]]
