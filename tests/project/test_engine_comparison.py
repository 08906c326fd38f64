"""The engine tier's judgement (``tests/helpers/engine_comparison.py``) can tell a request served
right from one served wrong, and never passes a run whose oracle failed."""

from __future__ import annotations

import pytest

from tests.helpers.engine_comparison import compare, summary_line, tolerance

pytestmark = pytest.mark.novllm


def _served(*requests: tuple[list[int], list[float]], **extra: object) -> dict:
    rows = [{"prompt_tokens": 5, "tokens": t, "logprobs": lp} for t, lp in requests]
    return {"run": "w", "requests": rows, **extra}


ORACLE = _served(([1, 2], [-3.0, -0.5]), ([7], [-2.0]))


def test_a_request_within_the_tolerance_is_equal():
    got = _served(([1, 2], [-3.0 + tolerance(-3.0), -0.5 - tolerance(-0.5)]), ([7], [-2.0]))
    assert compare(got, ORACLE).equal == [True, True]


def test_another_token_or_a_logprob_past_the_tolerance_is_not():
    tokens = _served(([1, 3], [-3.0, -0.5]), ([7], [-2.0]))
    assert compare(tokens, ORACLE).equal == [False, True]
    logprob = _served(([1, 2], [-3.0, -0.5]), ([7], [-2.0 - 2 * tolerance(-2.0)]))
    assert compare(logprob, ORACLE).equal == [True, False]
    shorter = _served(([1], [-3.0]), ([7], [-2.0]))
    assert compare(shorter, ORACLE).equal == [False, True]


def test_an_engine_that_stopped_serves_no_request_right():
    verdict = compare({"run": "w", "error": "AssertionError: x"}, ORACLE)
    assert verdict.error == "AssertionError: x" and verdict.equal == [False, False]


def test_an_oracle_that_failed_is_the_tiers_failure_not_a_verdict():
    with pytest.raises(RuntimeError, match="oracle could not serve"):
        compare(ORACLE, {"run": "w", "error": "ValueError: y"})


def test_the_tolerance_is_float16_steps_at_least_at_the_logits_magnitude():
    assert tolerance(-0.01) == tolerance(-4.0) == 8 * 2.0**-8
    assert tolerance(-9.0) == 8 * 2.0**-7


def test_the_summary_line_counts_requests():
    plugin = [compare(ORACLE, ORACLE)]
    stock = [compare({"run": "w", "error": "E"}, ORACLE)]
    line = summary_line("0.32.0", plugin, stock, {"w": "CPU_ATTN", "fp8": "ONE_PER_STEP"})
    assert line.startswith("engine 0.32.0: plugin 2/2 requests equal CPU_ATTN (fp8: one request")
    assert line.endswith("; stock (observe mode) 0/2")
    line = summary_line("0.34.0", plugin, stock, {"w": "ONE_PER_STEP"})
    assert line == (
        "engine 0.34.0: plugin 2/2 requests equal stock ROCM_AITER_FA one request per step; "
        "stock (observe mode) 0/2"
    )
