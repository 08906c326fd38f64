"""Hypothesis strategies for batches as vLLM's reordering and model runners produce them."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st


@dataclass(frozen=True)
class BatchSpec:
    threshold: int
    query_lens: list[int]
    seq_lens: list[int]
    upper_bound_slack: list[int]
    num_padding_tokens: int

    @property
    def num_actual_tokens(self) -> int:
        return sum(self.query_lens) + self.num_padding_tokens


@st.composite
def reordered_batches(
    draw: st.DrawFn,
    max_rows_per_region: int = 6,
    max_query: int = 64,
    max_context: int = 4096,
    thresholds: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8),
) -> BatchSpec:
    threshold = draw(st.sampled_from(thresholds))
    rows = st.integers(0, max_rows_per_region)
    context = st.integers(1, max_context)
    short_q = st.integers(1, threshold)
    long_q = st.integers(threshold + 1, max(threshold + 1, max_query))
    q: list[int] = []
    s: list[int] = []
    slack: list[int] = []

    def add(query: int, ctx: int) -> None:
        q.append(query)
        s.append(query + ctx)
        slack.append(draw(st.integers(0, 3)) if ctx else 0)

    for _ in range(draw(rows)):  # decodes
        add(draw(short_q), draw(context))
    for _ in range(draw(rows)):  # short extends
        add(draw(short_q), draw(context))
    for _ in range(draw(rows)):  # long extends
        add(draw(long_q), draw(context))
    for is_long in draw(st.lists(st.booleans(), max_size=max_rows_per_region)):  # prefills
        add(draw(long_q if is_long else short_q), 0)
    for _ in range(draw(st.integers(0, 2))):  # zero-length padded requests
        q.append(0)
        s.append(0)
        slack.append(0)
    if not q:
        add(draw(short_q), draw(context))
    return BatchSpec(threshold, q, s, slack, draw(st.integers(0, 8)))


def mixed_batches(**kwargs: object) -> st.SearchStrategy[BatchSpec]:
    """Reordered batches with at least one query longer than the threshold."""
    return reordered_batches(**kwargs).filter(lambda b: max(b.query_lens) > b.threshold)
