"""Steps as vLLM's scheduler hands them over, laid out by vLLM's own code: a hypothesis strategy."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st
from vllm.v1.attention.backend import CommonAttentionMetadata

from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    Request,
    chunk,
    decode,
    in_order,
    prompt,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import why_no_v1_order

needs_v1_order = pytest.mark.skipif(why_no_v1_order() is not None, reason=str(why_no_v1_order()))
"""For tests of V1-ordered steps: skipped, saying why, on a vLLM without the V1 runner."""
ORDERS = ("v2", "v1") if why_no_v1_order() is None else ("v2",)
"""The runner orders the installed vLLM lays steps out in (V1's only where it has that runner)."""


@dataclass(frozen=True)
class Step:
    threshold: int
    requests: tuple[Request, ...]
    num_padded_reqs: int = 0  # zero-length requests MRV2 appends for CUDA-graph sizes
    upper_bound_slack: tuple[int, ...] = ()

    def laid_out(self, order: str) -> tuple[list[int], list[int], CommonAttentionMetadata]:
        """Query and sequence lengths of the requests in runner ``order`` (:func:`in_order`), MRV2's
        padded requests last, and their real ``CommonAttentionMetadata``."""
        ordered = in_order(self.requests, order, self.threshold)
        query = [r.query_len for r in ordered] + [0] * self.num_padded_reqs
        seq = [r.context_len + r.query_len for r in ordered] + [0] * self.num_padded_reqs
        slack = [
            self.upper_bound_slack[i % len(self.upper_bound_slack)]
            if self.upper_bound_slack and i < len(ordered) and ordered[i].context_len
            else 0
            for i in range(len(query))
        ]
        return query, seq, samples.make_batch(query, seq, upper_bound_slack=slack)


@st.composite
def v2_steps(
    draw: st.DrawFn,
    thresholds: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
    max_requests: int = 16,
    max_query: int = 96,
    max_context: int = 4096,
) -> Step:
    """A step as the scheduler hands it to the model runner: decodes (with draft tokens when the
    threshold says speculation is on), new prompts short and long, chunked-prefill continuations
    and prefix-cache hits with context, in submission order, optionally CUDA-graph padded."""
    threshold = draw(st.sampled_from(thresholds))
    num_drafts = threshold - 1
    context = st.integers(1, max_context)
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
        requests.append(r)
    slack = tuple(draw(st.lists(st.integers(0, num_drafts), min_size=1, max_size=4)))
    return Step(threshold, tuple(requests), draw(st.integers(0, 2)), slack)
