"""Hypothesis strategies for batches as vLLM's model runners lay them out, as forward cases (the
one batch type: ``diagnostics/forward/cases.py``): steps as the scheduler hands them over, laid
out by vLLM's own code, and batches already in V1's region order."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import strategies as st

from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    ForwardCase,
    Request,
    chunk,
    decode,
    prompt,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import why_no_v1_order

needs_v1_order = pytest.mark.skipif(why_no_v1_order() is not None, reason=str(why_no_v1_order()))
"""For tests of V1-ordered steps: skipped, saying why, on a vLLM without the V1 runner."""
ORDERS = ("v2", "v1") if why_no_v1_order() is None else ("v2",)
"""The runner orders the installed vLLM lays steps out in (V1's only where it has that runner)."""


@st.composite
def reordered_batches(
    draw: st.DrawFn,
    max_rows_per_region: int = 6,
    max_query: int = 64,
    max_context: int = 4096,
    thresholds: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8),
) -> ForwardCase:
    """A batch in V1's region order (decodes, short extends, long extends, prefills, which may
    be short), laid out as given, with padded requests, padding tokens and an upper bound that
    overstates rows with context."""
    threshold = draw(st.sampled_from(thresholds))
    rows = st.integers(0, max_rows_per_region)
    context = st.integers(1, max_context)
    short_q = st.integers(1, threshold)
    long_q = st.integers(threshold + 1, max(threshold + 1, max_query))
    requests: list[Request] = []

    def add(query: int, ctx: int, done: bool = False) -> None:
        slack = draw(st.integers(0, 3)) if ctx else 0
        prompt_len = None if done else ctx + query + (1 if ctx else 0)
        requests.append(Request(f"r{len(requests)}", ctx, query, 0, prompt_len, slack))

    for _ in range(draw(rows)):  # decodes
        add(draw(short_q), draw(context), done=True)
    for _ in range(draw(rows)):  # short extends
        add(draw(short_q), draw(context))
    for _ in range(draw(rows)):  # long extends
        add(draw(long_q), draw(context))
    for is_long in draw(st.lists(st.booleans(), max_size=max_rows_per_region)):  # prefills
        add(draw(long_q if is_long else short_q), 0)
    padded = draw(st.integers(0, 2))  # zero-length padded requests
    if not requests and not padded:
        add(draw(short_q), draw(context), done=True)
    return ForwardCase("reordered", tuple(requests), "given", spec_tokens=threshold - 1,
                       num_padded_reqs=padded, num_padding_tokens=draw(st.integers(0, 8)))  # fmt: skip


def mixed_batches(**kwargs: object) -> st.SearchStrategy[ForwardCase]:
    """Reordered batches with at least one query longer than the threshold."""
    return reordered_batches(**kwargs).filter(
        lambda b: max((r.query_len for r in b.requests), default=0) > b.threshold
    )


@st.composite
def v2_steps(
    draw: st.DrawFn,
    thresholds: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
    max_requests: int = 16,
    max_query: int = 96,
    max_context: int = 4096,
) -> ForwardCase:
    """A step as the scheduler hands it to the model runner: decodes (with draft tokens when the
    threshold says speculation is on), new prompts short and long, chunked-prefill continuations
    and prefix-cache hits with context, in submission order, optionally CUDA-graph padded, laid
    out in model-runner V2 order (``laid_out("v1")``: the V1 reorder's)."""
    threshold = draw(st.sampled_from(thresholds))
    num_drafts = threshold - 1
    context = st.integers(1, max_context)
    slack = st.integers(0, num_drafts)
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        kind = draw(
            st.sampled_from(["decode", "decode", "prompt", "prompt", "continuation", "cache-hit"])
        )
        if kind == "decode":
            accepted = draw(st.booleans()) or not num_drafts
            q = 1 + num_drafts if accepted else draw(st.integers(1, 1 + num_drafts))
            r = decode(f"r{i}", draw(context), q, num_drafts if q > 1 else 0)
        elif kind == "prompt":
            r = prompt(f"r{i}", draw(st.integers(1, max_query)))
        else:  # a later chunk of a long prompt, or a new prompt whose prefix was cached
            r = chunk(f"r{i}", draw(context), draw(st.integers(1, max_query)))
        if r.context_len:
            r = Request(r.req_id, r.context_len, r.query_len, r.num_drafts, r.prompt_len,
                        draw(slack))  # fmt: skip
        requests.append(r)
    return ForwardCase("v2-step", tuple(requests), "v2", spec_tokens=num_drafts,
                       num_padded_reqs=draw(st.integers(0, 2)))  # fmt: skip
