"""The forward tier on CPU: vLLM's real ROCM_AITER_FA forward judged by each request's output.

One child process (Triton's interpreter environment) runs every case of
``diagnostics/forward/cases.py`` plus steps of vLLM's Scheduler through vLLM's ``Attention`` layer,
custom ops, ``AiterFlashAttentionImpl`` and vLLM's own Triton kernels (merge, gather), with stock's
backend and the plugin's. AITER's Triton ``unified_attention`` is AITER's own kernel, loaded from the
pinned ``amd-aiter`` wheel (``diagnostics/forward/aiter_triton.py``); only AITER's compiled kernels
and vLLM's C cache op are torch references. Each request's output is compared with plain attention
over its whole context and its own new tokens. Expectations come from the installed release:
stock's regions, stock's context chunks, and what this release's merge does with two empty states
(run here, not looked up).
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import summary_lines
from tests.helpers import (
    environment,
    forward_background,
    forward_checks,
    scheduler_trace,
    vllm_releases,
)
from vllm_rocm_aiter_plugin.diagnostics.forward import runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES

pytestmark = [pytest.mark.cpu, pytest.mark.subprocess, pytest.mark.forward]


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> dict:
    result = forward_background.report_or_skip()  # started when collection ended (conftest)
    used = result["unified_attention"]
    summary_lines(request.config).append(
        f"forward tier: unified_attention: {used['kernel']}; {used['calls']} calls; "
        f"largest |kernel - reference| {used.get('cross_check_largest_error')}"
    )
    return result


_case = forward_checks.case_of


def test_the_forward_child_runs_the_installed_copy(report):
    assert environment.is_installed_copy(report["plugin_file"]), report["plugin_file"]


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_plugin_output_equals_the_reference_for_every_request(report, name):
    forward_checks.check_plugin(_case(report, name))


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_stock_is_wrong_exactly_where_it_drops_context(report, name):
    forward_checks.check_stock(_case(report, name), report["merge_makes_nan_of_empty_states"])


def test_stock_drops_context_somewhere_on_every_release(report):
    """Control: the stock expectations above are not vacuous on this release."""
    wrong = [
        c["case"]
        for c in report["cases"]
        if "rows" in c.get("stock", {}) and forward_checks.bad_rows(c["stock"], c["tolerance"])
    ]
    assert bool(wrong) == vllm_releases.installed_drops_context_in_v2_order()


@pytest.mark.parametrize("name", [c.name for c in CASES if c.order == "v2"])
def test_v2_steps_take_no_more_context_chunks_than_stock_in_v1_order(report, name):
    forward_checks.check_chunks(_case(report, name))


def test_64_prompts_need_one_context_chunk_where_stock_sizing_needs_17(report):
    """64 new prompts and one continuation with 8192 cached tokens, in V2 order: sized by the
    rows that gather context, one chunk; sized as vLLM's build() does (all 65 extend rows), 17."""
    case = _case(report, "64-prompts-v2")
    assert case["plugin"]["chunks"] == 1
    assert case["plugin-vllm-build"]["chunks"] == 17
    assert forward_checks.bad_rows(case["plugin-vllm-build"], case["tolerance"]) == set()


def test_the_plugins_impl_is_what_keeps_empty_chunks_finite(report):
    """Control: the plugin's builder with vLLM's own impl on a two-chunk extend region holding a
    new prompt. NaN exactly where this release's merge makes NaN of two empty states."""
    case = _case(report, "multi-chunk-v2")
    control = case["plugin-builder-only"]
    assert control["chunks"] == 2
    context_free = {
        r["req_id"] for r in control["rows"] if r["region"] == "extend" and not r["context"]
    }
    assert context_free == {"new-prompt"}
    expected = context_free if report["merge_makes_nan_of_empty_states"] else set()
    assert forward_checks.nan_rows(control) == expected
    assert forward_checks.nan_rows(case["plugin"]) == set()


def test_the_plugins_impl_is_what_counts_the_sink_once(report):
    """Controls for attention sinks. V2 order: the plugin's builder with vLLM's impl moves the
    new prompt into the extend path, whose merges count the sink once per call: that row is
    wrong, the plugin right. Where vLLM's own extend path counts the sink once (0.34.0), the
    plugin steps aside: its impl gives exactly what vLLM's impl gives, and both are right. V1
    order: the plugin's regions are stock's, and stock's row with context is wrong where the
    plugin's impl makes it right."""
    case = _case(report, "v2-sinks")
    control, plugin = case["plugin-builder-only"], case["plugin"]
    moved = {r["req_id"] for r in control["rows"] if r["region"] == "extend" and not r["context"]}
    assert moved == {"new-prompt"}
    assert forward_checks.bad_rows(plugin, case["tolerance"]) == set()
    assert _case(report, "multi-chunk-v2-sinks")["plugin"]["chunks"] == 2
    assert report["vllm_counts_sink_once"] == vllm_releases.installed_counts_sink_once()
    if report["vllm_counts_sink_once"]:
        assert [r["error"] for r in control["rows"]] == [r["error"] for r in plugin["rows"]]
        return
    assert moved <= forward_checks.bad_rows(control, case["tolerance"])
    v1 = _case(report, "v1-sinks")
    assert v1["plugin"]["regions"] == v1["stock"]["regions"]
    with_context = {r["req_id"] for r in v1["stock"]["rows"] if r["region"] == "extend"}
    assert with_context == {"continuation"}
    assert forward_checks.bad_rows(v1["stock"], v1["tolerance"]) == with_context
    assert forward_checks.bad_rows(v1["plugin"], v1["tolerance"]) == set()


def test_steps_of_vllms_scheduler(report):
    """Steps of vLLM's Scheduler on the serving trace's workloads where stock drops context in
    V2 order, in V2 and V1 order: the plugin is right on every request; stock only in V1."""
    cases = [c for c in report["cases"] if c["case"].startswith("scheduler-")]
    orders = 1 if report["v1_order_absent"] else 2  # V1 order only where vLLM has that runner
    assert len(cases) == orders * len(scheduler_trace.SCHEDULER_WORKLOADS)
    merge_nan = report["merge_makes_nan_of_empty_states"]
    for case in cases:
        forward_checks.check_plugin(case)
        forward_checks.check_stock(case, merge_nan)
        forward_checks.check_chunks(case)
        assert bool(forward_checks.expected_stock_wrong(case, merge_nan)) == (
            case["order"] == "v2"
        ), case["case"]


def test_vllms_own_kernels_ran(report):
    """vLLM's Triton gather ran (and checked every reference gather); the merge is vLLM's own."""
    assert report["gather"].startswith("vLLM's")
    calls = report["gather_calls"]
    assert calls["kernel"] > 0
    assert calls["reference"] == 0 or calls["kernel_checked_tokens"] > 0


UNIFIED_ATTENTION_CASES = (
    "eagle-pure-decode-no-upper-bound",
    "eagle-verify-padded",
    "eagle-verify-padded-bf16",
    "eagle-verify-sliding-window",
    "eagle-mixed-v2",
    "eagle-mixed-v2-head128-block32-mha",
    "v1-eagle-short-prompt-multi-chunk",
    "eagle-mixed-v2-fp8-e4m3fnuz",
)
"""Cases whose decode rows take ``unified_attention`` on every release: EAGLE verification (query
length > 1), with model-runner V2's padded requests, in bf16, under a sliding window. (Decodes of
one token under a sliding window take it on 0.23.0; 0.33.0 sends them to ``paged_attention_v1``.)"""


def test_aiters_own_unified_attention_ran_where_its_wheel_is_installed(report):
    """With the pinned amd-aiter wheel the tier runs AITER's Triton kernel, not the reference,
    on every case whose decode path calls it; the kernel that ran is in the report."""
    used = report["unified_attention"]
    if not environment.pinned_aiter_installed():
        pytest.skip(f"the pinned amd-aiter wheel is not installed; ran: {used['kernel']}")
    assert used["aiter"], used["kernel"]
    assert used["kernel"].startswith("AITER's Triton unified_attention"), used["kernel"]
    assert "aiter...unified_attention" not in report["references"]
    for name in UNIFIED_ATTENTION_CASES:
        assert _case(report, name)["plugin"]["unified_attention_calls"] > 0, name


def test_bf16_calls_run_aiters_kernel_widened_to_fp32(report):
    """The interpreter's bf16 dot is wrong; bf16 calls go through the widening, and say so."""
    used = report["unified_attention"]
    if not used["aiter"] or used["calls"] is None:
        pytest.skip(f"no widening: the kernel that ran is {used['kernel']}")
    assert _case(report, "eagle-verify-padded-bf16")["plugin"]["unified_attention_calls"] > 0
    assert used["bf16_widened_calls"] > 0
    assert "bfloat16" in used["cross_check_largest_error"]


def test_without_aiters_wheel_the_torch_reference_runs_and_says_so(tmp_path):
    """Control: an ``aiter`` package without AITER's Triton module first on the path. The tier
    falls back to the reference, names it, and the case still passes."""
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    result = runner.run_in_child(["eagle-verify-padded"], extra_env={"PYTHONPATH": path})
    if "unavailable" in result:
        pytest.skip(result["unavailable"])
    used = result["unified_attention"]
    assert not used["aiter"], used
    assert used["kernel"].startswith("the torch reference (")
    assert "has no ops/triton/unified_attention.py" in used["kernel"]
    assert "aiter...unified_attention" in result["references"]
    assert used["calls"] > 0
    forward_checks.check_plugin(result["cases"][0])


def test_the_reference_agrees_with_aiters_kernel_on_every_call_of_the_tier(report):
    """Each call the tier made to AITER's kernel, rerun through the torch reference on the same
    inputs: within two units in the last place of the call's dtype."""
    used = report["unified_attention"]
    if not used["aiter"] or used["calls"] is None:
        pytest.skip(f"no cross-check: the kernel that ran is {used['kernel']}")
    assert used["cross_checked_calls"] == used["calls"] > 0
    assert used["cross_check_disagreements"] == 0, used
