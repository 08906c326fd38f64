"""``ab``'s judgement without an engine: where a run parts from the reference, the verdict (the
plugin never worse than stock), the table, and the prompts file."""

from __future__ import annotations

import pytest

from vllm_rocm_aiter_plugin.diagnostics import ab

pytestmark = [pytest.mark.project, pytest.mark.novllm]


def _served(attention: str, *tokens: list[int], counted: int = 0) -> dict:
    requests = [{"prompt_tokens": 10 * (i + 1), "tokens": t} for i, t in enumerate(tokens)]
    return {"attention": attention, "requests": requests, "seconds": 2.0, "exposure": [counted]}


def _outcomes(stock: dict, plugin: dict) -> dict[str, ab.Outcome]:
    reference = _served("TRITON_ATTN", [1, 2, 3], [4, 5, 6])
    served = {"reference": reference, "stock": stock, "plugin": plugin}
    return {run: ab.outcome(run, served[run], reference) for run in ab.RUNS}


def test_parts_at_is_the_first_token_that_differs():
    assert ab.parts_at([1, 2, 3], [1, 2, 3]) is None
    assert ab.parts_at([1, 9, 3], [1, 2, 3]) == 1
    assert ab.parts_at([1, 2], [1, 2, 3]) == 2


def test_stock_wrong_and_the_plugin_right_is_never_worse():
    outcomes = _outcomes(
        _served("ROCM_AITER_FA", [1, 9, 9], [4, 5, 6], counted=1),
        _served("ROCM_AITER_FA", [1, 2, 3], [4, 5, 6], counted=1),
    )
    line, code = ab.verdict(outcomes)
    assert code == ab.EXIT_OK
    assert "stock parts from TRITON_ATTN on 1 of 2 requests (1 request-steps" in line
    assert line.endswith("the plugin on 0; 1 corrected")
    shown = ab.table(outcomes, {"reference": _served("TRITON_ATTN", [1], [2])})
    assert "| 0 | 10 | parts at token 1 | same |" in shown
    assert "plugin (ROCM_AITER_FA): 3.0 tokens/s" in shown


def test_a_request_only_the_plugin_parts_on_is_a_finding():
    outcomes = _outcomes(
        _served("ROCM_AITER_FA", [1, 2, 3], [4, 5, 6]),
        _served("ROCM_AITER_FA", [1, 2, 3], [4, 7, 6]),
    )
    line, code = ab.verdict(outcomes)
    assert code == ab.EXIT_WORSE and "requests [1] part only with the plugin" in line


def test_a_request_both_part_on_is_no_finding_and_a_failed_run_is_named():
    both = _served("ROCM_AITER_FA", [1, 2, 3], [4, 7, 6])
    assert ab.verdict(_outcomes(both, both))[1] == ab.EXIT_OK
    crashed = {"attention": "ROCM_AITER_FA", "error": "AssertionError: seq_lens_cpu_upper_bound"}
    line, code = ab.verdict(_outcomes(crashed, _served("ROCM_AITER_FA", [1, 2, 3], [4, 5, 6])))
    assert code == ab.EXIT_OK and "stock failed (AssertionError" in line
    line, code = ab.verdict(_outcomes(both, {**crashed}))
    assert code == ab.EXIT_CHECK_FAILED and line.startswith("the plugin run could not serve")


def test_the_prompts_file_takes_texts_token_ids_and_objects(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('"a text"\n[1, 2, 3]\n\n{"prompt_token_ids": [4]}\n')
    assert ab.read_prompts(str(path)) == [
        {"prompt": "a text"}, {"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4]},
    ]  # fmt: skip
    path.write_text("42\n")
    with pytest.raises(ValueError, match="neither a text nor token ids"):
        ab.read_prompts(str(path))
