"""The forward tier on CPU: vLLM's real ROCM_AITER_FA forward judged by each request's output."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import summary_lines
from tests.helpers import (
    environment,
    forward_checks,
    forward_child,
    graph_replay,
    scheduler_trace,
)
from tests.helpers.aiter_triton import load_unified_attention
from tests.helpers.forward_checks import case_of
from tests.helpers.forward_child import TIER_KINDS
from vllm_rocm_aiter_plugin.builder import own_build_default
from vllm_rocm_aiter_plugin.diagnostics import probe
from vllm_rocm_aiter_plugin.diagnostics.forward import harness, runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES, FP8_EAGLE_CASE, FP8_FORMATS
from vllm_rocm_aiter_plugin.diagnostics.forward.report import CaseResult, ForwardReport
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import in_order


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest) -> ForwardReport:
    result = forward_child.tier_report_or_skip()
    used = result.unified_attention
    summary_lines(request.config).append(
        f"forward tier: unified_attention: {used['kernel']}; {used['calls']} calls "
        f"({used.get('repeated_calls', 0)} repeating an earlier call's inputs); "
        f"largest |kernel - reference| {used.get('cross_check_largest_error')}"
    )
    return result


def test_the_forward_child_runs_the_installed_copy(report):
    assert environment.is_installed_copy(report.plugin_file), report.plugin_file


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_plugin_output_equals_the_reference_for_every_request(report, name):
    forward_checks.check_plugin(case_of(report, name))


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_stock_is_wrong_exactly_where_it_drops_context(report, name):
    forward_checks.check_stock(case_of(report, name), report.facts)


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_observe_serves_stocks_output_and_counts_the_rows_served_without_context(report, name):
    forward_checks.check_exposure(case_of(report, name), report.facts)


def test_mutation_a_count_that_misses_a_row_fails_the_tier(report):
    """The count planted to leave out one exposed row: the exposure check fails on it, while
    every output stays right (the count changes nothing served)."""
    (case,), _ = forward_child.mutated(report, "exposure-misses-a-row")
    assert (
        case["observe"].counted["request_steps"] == len(case["stock"].served_without_context()) - 1
    )
    with pytest.raises(AssertionError):
        forward_checks.check_exposure(case, report.facts)
    forward_checks.check_plugin(case)


def test_stock_drops_context_somewhere_on_every_release(report):
    """Control: the stock expectations above are not vacuous on this release."""
    wrong = [
        c.case for c in report.cases if "stock" in c.outcomes and c["stock"].wrong(c.tolerance)
    ]
    assert bool(wrong) == probe.probe_stock_v2_order().affected


@pytest.mark.parametrize("name", [c.name for c in CASES if c.order == "v2"])
def test_each_v2_case_takes_no_more_context_chunks_than_stock_in_v1_order(report, name):
    forward_checks.check_chunks(case_of(report, name))


def test_64_prompts_need_one_context_chunk_where_stock_sizing_needs_5(report):
    """64 new prompts and one continuation with 2048 cached tokens, in V2 order: sized by the
    rows that gather context, one chunk; sized as vLLM's build() does (all 65 extend rows), 5."""
    case = case_of(report, "64-prompts-v2")
    assert case["plugin"].chunks == 1 and case["plugin"].own_build is True
    control = case["plugin-vllm-build"]
    assert control.chunks == 5 and control.own_build is False
    assert control.wrong(case.tolerance) == set()


def test_the_plugins_impl_is_what_keeps_empty_chunks_finite(report):
    """Control: the plugin's builder with vLLM's own impl on a two-chunk extend region holding a
    new prompt. NaN exactly where this release's merge makes NaN of two empty states."""
    case = case_of(report, "multi-chunk-v2")
    control = case["plugin-builder-only"]
    assert control.chunks == 2
    context_free = {r.req_id for r in control.rows if r.region == "extend" and not r.context}
    assert context_free == {"new-prompt"}
    expected = context_free if report.facts.merge_nan else set()
    assert control.nan() == expected
    assert case["plugin"].nan() == set()


def test_the_plugins_impl_is_what_counts_the_sink_once(report):
    """Controls for attention sinks. V2 order: the plugin's builder with vLLM's impl moves the
    new prompt into the extend path, whose merges count the sink once per call: that row is
    wrong, the plugin right. Where vLLM's own extend path counts the sink once (0.34.0), the
    plugin steps aside: its impl gives exactly what vLLM's impl gives, and both are right. V1
    order: the plugin's regions are stock's, and stock's row with context is wrong where the
    plugin's impl makes it right."""
    case = case_of(report, "v2-sinks")
    control, plugin = case["plugin-builder-only"], case["plugin"]
    moved = {r.req_id for r in control.rows if r.region == "extend" and not r.context}
    assert moved == {"new-prompt"}
    assert plugin.wrong(case.tolerance) == set()
    assert case_of(report, "multi-chunk-v2-sinks")["plugin"].chunks == 2
    if report.facts.counts_sink_once:
        assert [r.error for r in control.rows] == [r.error for r in plugin.rows]
        return
    assert moved <= control.wrong(case.tolerance)
    v1 = case_of(report, "v1-sinks")
    assert v1["plugin"].regions == v1["stock"].regions
    with_context = {r.req_id for r in v1["stock"].rows if r.region == "extend"}
    assert with_context == {"continuation"}
    assert v1["stock"].wrong(v1.tolerance) == with_context
    assert v1["plugin"].wrong(v1.tolerance) == set()


@pytest.mark.parametrize("name", forward_child.STOPGAP_CASES)
def test_the_stopgap_serves_every_row_where_stock_drops_context(report, name):
    """The README's stopgap without the plugin: vLLM's TRITON_ATTN (no three-way split) on the
    same V2-ordered step, through vLLM's real builder, impl and Triton kernels, interpreted:
    every row right, where stock's ROCM_AITER_FA gets one wrong (or stops)."""
    case = case_of(report, name)
    stopgap, stock = case[forward_child.STOPGAP], case["stock"]
    assert stopgap.error is None, stopgap.traceback
    assert len(stopgap.rows) == len(stock.rows or stopgap.rows)
    assert stopgap.wrong(case.tolerance) == set()
    assert stock.error or stock.wrong(case.tolerance)


def test_steps_of_vllms_scheduler(report):
    """Steps of vLLM's Scheduler on the serving trace's workloads where stock drops context in
    V2 order, in V2 and V1 order: the plugin is right on every request; stock only in V1."""
    cases = [c for c in report.cases if c.case.startswith("scheduler-")]
    orders = 1 if report.facts.no_v1_runner else 2  # V1 order only where vLLM has that runner
    assert len(cases) == orders * len(scheduler_trace.SCHEDULER_WORKLOADS)
    for case in cases:
        forward_checks.check_plugin(case)
        forward_checks.check_stock(case, report.facts)
        forward_checks.check_chunks(case)
        forward_checks.check_exposure(case, report.facts)
        expected = forward_checks.expected_stock_wrong(case, report.facts)
        assert bool(expected) == (case.order == "v2"), case.case


def test_vllms_own_kernels_ran(report):
    """vLLM's Triton gather and merge ran (and checked every budgeted call of the references)."""
    assert report.gather.startswith("vLLM's")
    calls = report.gather_calls
    assert calls["kernel_calls"] > 0
    assert calls["reference_calls"] == 0 or calls["checked_tokens"] > 0
    merges = report.merge_calls
    assert merges["kernel_calls"] + merges["budgeted_calls"] > 0
    assert merges["budgeted_calls"] == 0 or merges["checked_tokens"] > 0


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
    used = report.unified_attention
    if not environment.pinned_aiter_installed():
        pytest.skip(f"the pinned amd-aiter wheel is not installed; ran: {used['kernel']}")
    assert used["aiter"], used["kernel"]
    assert used["kernel"].startswith("AITER's Triton unified_attention"), used["kernel"]
    assert "aiter...unified_attention" not in report.references
    for name in UNIFIED_ATTENTION_CASES:
        if report.case(name) is not None:  # a V1-order case where vLLM has that runner
            assert case_of(report, name)["plugin"].unified_attention_calls > 0, name


def test_bf16_calls_run_aiters_kernel_widened_to_fp32(report):
    """The interpreter's bf16 dot is wrong; bf16 calls go through the widening, and say so."""
    used = report.unified_attention
    if not used["aiter"] or used["calls"] is None:
        pytest.skip(f"no widening: the kernel that ran is {used['kernel']}")
    assert case_of(report, "eagle-verify-padded-bf16")["plugin"].unified_attention_calls > 0
    assert used["bf16_widened_calls"] > 0
    assert "bfloat16" in used["cross_check_largest_error"]


def test_without_aiters_wheel_the_torch_reference_runs_and_says_so(tmp_path, monkeypatch):
    """Control: an ``aiter`` package without AITER's Triton module first on the path: AITER's
    kernel does not load, and says why; the commands' own default is then the torch reference
    (which the doctor and the demo run, and whose cases pass: ``tests/commands``)."""
    (tmp_path / "aiter").mkdir()
    (tmp_path / "aiter" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernel, why_not = load_unified_attention()
    assert kernel is None and "has no ops/triton/unified_attention.py" in why_not
    default = runner.unified_attention_for(torch.device("cpu"))
    assert default is not None and not default.is_aiter
    assert default.function.__module__.endswith("reference_kernels")


def test_the_reference_agrees_with_aiters_kernel_on_every_call_of_the_tier(report):
    """Each call the tier made to AITER's kernel, rerun through the torch reference on the same
    inputs: within two units in the last place of the call's dtype. The graph replays' frozen
    controls alone run the reference without the kernel."""
    used = report.unified_attention
    if not used["aiter"] or used["calls"] is None:
        pytest.skip(f"no cross-check: the kernel that ran is {used['kernel']}")
    frozen = sum(
        len(c[kind]["frozen_replays"]) for c in _cases(report).values() for kind in runner.KINDS
    )
    assert used["reference_only_calls"] <= frozen
    assert used["cross_checked_calls"] == used["calls"] - used["reference_only_calls"] > 0
    assert used["cross_check_disagreements"] == 0, used


# ---- fp8 KV caches (--kv-cache-dtype fp8): MI300's e4m3fnuz and gfx950's e4m3fn, with scales that
# are not 1. AITER's unified_attention runs on the fp8 caches themselves (never widened) and
# agrees with the reference on every call; a reference that drops the scales, or caches widened
# so that AITER's kernel skips its descale, make the tier fail. (The references' own fp8
# arithmetic: tests/unit/test_references.py.)

FP8_CASES = [c for c in CASES if c.fp8]


def test_fp8_cases_cover_both_formats_both_orders_and_scales_that_are_not_1():
    assert {c.fp8_format for c in FP8_CASES} == set(FP8_FORMATS)
    assert {c.order for c in FP8_CASES} == {"v1", "v2"}
    assert all(c.k_scale != 1.0 and c.v_scale != 1.0 for c in FP8_CASES)
    assert any(c.sliding_window for c in FP8_CASES) and any(c.spec_tokens for c in FP8_CASES)


def test_every_case_runs_on_cpu(report):
    """The CPU tier runs every fp8 format; only a non-causal case is set aside, where this
    release's model-runner V2 builds no non-causal batch, a shuffle-layout case, where stock's
    shuffle layout cannot run right on this release (or, with KV scales, where its cache write
    ignores them), and a sinks case, where this release's ROCM_AITER_FA takes no sinks."""
    set_aside = {c.case for c in report.cases if c.not_applicable}
    non_causal = {c.name for c in CASES if not c.causal}
    shuffle = {c.name for c in CASES if c.shuffle}
    expected = set() if runner.builds_non_causal_batches() else non_causal
    if probe.shuffle_layout_unavailable():
        expected |= shuffle
    if not probe.takes_sinks():
        expected |= {c.name for c in CASES if c.sinks}
    if report.shuffle_write_ignores_kv_scales:
        expected |= {c.name for c in CASES if c.shuffle and c.fp8 and c.k_scale != 1.0}
    assert set_aside == expected


@pytest.mark.parametrize("name", [c.name for c in FP8_CASES])
def test_fp8_case_reports_its_configuration(report, name):
    case = case_of(report, name)
    wanted = next(c for c in FP8_CASES if c.name == name)
    assert case.configuration["kv_cache_dtype"] == "fp8"
    assert case.configuration["fp8_format"] == wanted.fp8_format


def test_aiters_kernel_reads_the_fp8_caches_unwidened(report):
    used = report.unified_attention
    if not used["aiter"] or used["calls"] is None:
        pytest.skip(f"AITER's kernel did not run here: {used['kernel']}")
    assert case_of(report, FP8_EAGLE_CASE)["plugin"].unified_attention_calls > 0
    assert used["fp8_cache_calls"] > 0
    assert used["cross_check_disagreements"] == 0, used


def _mutated(report: ForwardReport, mutation: str) -> tuple[CaseResult, dict]:
    """The EAGLE fp8 case as the tier's child ran it with ``mutation`` planted."""
    (case,), used = forward_child.mutated(report, mutation)
    return case, used


def _decode_rows_off(case: CaseResult) -> set[str]:
    plugin = case["plugin"]
    assert plugin.error is None, plugin.traceback or plugin.error
    return {r.req_id for r in plugin.rows if r.region == "decode" and r.wrong(case.tolerance)}


def test_mutation_a_reference_that_drops_the_scales_fails_the_tier(report):
    """The torch reference runs as ``unified_attention`` and ignores ``k_descale``/``v_descale``:
    the EAGLE rows it serves are off their reference, so the tier's plugin check fails."""
    case, used = _mutated(report, "reference-drops-kv-scales")
    assert not used["aiter"]
    assert _decode_rows_off(case) == {"decode-a", "decode-b"}
    with pytest.raises(AssertionError):
        forward_checks.check_plugin(case)


def test_mutation_widened_fp8_caches_fail_the_tier(report):
    """AITER's kernel handed fp8 caches widened to float32 skips its descale: its rows are off,
    and the cross-check against the reference disagrees."""
    if not environment.pinned_aiter_installed():
        pytest.skip("the pinned amd-aiter wheel is not installed: AITER's kernel cannot run")
    case, used = _mutated(report, "widened-fp8-caches")
    assert used["aiter"], used["kernel"]
    assert used["cross_check_disagreements"] > 0
    assert _decode_rows_off(case) == {"decode-a", "decode-b"}


# ---- The shuffle KV-cache layout (VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1): switched on for vLLM's
# methods in the child only (private globals that see a rocm_aiter_ops answering True). The
# plugin's builder runs vLLM's build() code there, its own build elsewhere; vLLM's own shuffle
# write and gather run. (The write and decode references: tests/unit/test_references.py.)

SHUFFLE_CASES = [c for c in CASES if c.shuffle]


def _ran(report: ForwardReport) -> list[CaseResult]:
    return [c for c in report.cases if c.case in {s.name for s in SHUFFLE_CASES}]


def _applicable(report: ForwardReport) -> set[str]:
    return {c.case for c in _ran(report) if not c.not_applicable}


def test_shuffle_cases_cover_both_orders_both_fp8_formats_and_a_16_bit_cache():
    assert {c.order for c in SHUFFLE_CASES} == {"v1", "v2"}
    assert {c.fp8_format for c in SHUFFLE_CASES if c.fp8} == set(FP8_FORMATS)
    assert any(not c.fp8 for c in SHUFFLE_CASES)
    assert all(c.k_scale != 1.0 for c in SHUFFLE_CASES if c.fp8)
    # the layout refuses EAGLE's multi-token decodes and sliding windows (vLLM's asserts)
    assert not any(c.spec_tokens or c.sliding_window for c in SHUFFLE_CASES)


def test_the_shuffle_gather_reads_two_context_chunks_with_a_context_free_row(report):
    """The layout's gather, chunk by chunk, in an extend region holding a moved new prompt."""
    case = next(c for c in _ran(report) if c.case == "multi-chunk-v2-shuffle-fp8")
    if case.not_applicable:
        pytest.skip(case.not_applicable)
    plugin = case["plugin"]
    assert plugin.chunks == 2
    moved = [r for r in plugin.rows if r.region == "extend" and not r.context]
    assert [r.req_id for r in moved] == ["new-prompt"]


def _scaled_fp8(name: str) -> bool:
    case = next(c for c in SHUFFLE_CASES if c.name == name)
    return case.fp8 and case.k_scale != 1.0


def test_shuffle_cases_run_where_stocks_layout_runs(report):
    """Set aside exactly where stock's layout cannot run; and the fp8 cases with KV scales where
    this release's cache write ignores them (0.30: stock's and the plugin's alike)."""
    unavailable = probe.shuffle_layout_unavailable()
    ignores = report.shuffle_write_ignores_kv_scales
    assert not isinstance(ignores, str), ignores  # the probe itself failed
    for case in _ran(report):
        why = case.not_applicable
        if unavailable is None and ignores and _scaled_fp8(case.case):
            assert why is not None and "ignores the KV scales" in why, case.case
        else:
            assert why == unavailable, case.case


def test_the_plugins_builder_runs_vllms_build_under_shuffle_and_its_own_elsewhere(report):
    own = own_build_default()
    bodies = {
        c.case: c["plugin"].own_build
        for c in report.cases
        if "plugin" in c.outcomes and c["plugin"].error is None
    }
    shuffle = {c.name for c in SHUFFLE_CASES}
    for name, body in bodies.items():
        assert body is (False if name in shuffle else own), name
    if probe.shuffle_layout_unavailable() is None:
        assert _applicable(report) <= set(bodies)


def test_vllms_shuffle_write_ran_on_every_shuffle_step(report):
    from vllm.v1.attention.backends import rocm_aiter_fa

    if probe.shuffle_layout_unavailable():
        pytest.skip(probe.shuffle_layout_unavailable())
    if harness.SHUFFLE_WRITE_NAME in vars(rocm_aiter_fa):
        pytest.skip("on ROCm the tier runs vLLM's own shuffle write as it is, uncounted")
    calls = report.shuffle_write_calls
    # each case writes its context, then its new tokens, once per backend (stock, plugin, observe)
    ran = [c for c in SHUFFLE_CASES if c.name in _applicable(report)]
    assert calls["kernel_calls"] == 2 * len(TIER_KINDS) * len(ran)
    fp8_cases = [c for c in ran if c.fp8]
    if report.device == "cpu":  # the reference writes fp8 caches (the interpreter's rounding)
        assert calls["reference_calls"] == 2 * len(TIER_KINDS) * len(fp8_cases)


# ---- A non-causal batch (CommonAttentionMetadata.causal False, which 0.33's model-runner V2
# builds): the prefill kernel honours it, the extend path runs causally whatever the batch says
# (docs/upstream/README.md), so the plugin gives stock's regions there (docs/deviations.md).

NON_CAUSAL = [c.name for c in CASES if not c.causal]


def test_there_is_a_v2_non_causal_case_with_a_new_prompt_before_a_row_with_context():
    case = next(c for c in CASES if c.name in NON_CAUSAL)
    rows = in_order(case.requests, case.order, case.threshold)
    first_with_context = next(i for i, r in enumerate(rows) if r.context_len and r.query_len > 1)
    assert case.order == "v2"
    assert any(not r.context_len and r.query_len > 1 for r in rows[:first_with_context])


def _non_causal(report: ForwardReport, name: str) -> CaseResult:
    found = report.case(name)
    if found is not None and found.not_applicable:
        assert not runner.builds_non_causal_batches()
    return case_of(report, name)


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_context_free_rows_equal_their_non_causal_reference(report, name):
    case = _non_causal(report, name)
    assert case.configuration["causal"] is False
    context_free = [r for r in case["plugin"].rows if not r.context]
    assert context_free
    for row in context_free:
        assert not row.wrong(case.tolerance), row


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_the_plugin_is_stock_on_a_non_causal_batch(report, name):
    """Same regions, same output on every row: never worse than stock, row by row."""
    case = _non_causal(report, name)
    assert case["plugin"].regions == case["stock"].regions
    assert case["plugin"].rows == case["stock"].rows


@pytest.mark.parametrize("name", NON_CAUSAL)
def test_control_the_reference_is_non_causal(report, name):
    """Control: a prompt of more than one token run causally is not its non-causal reference, so
    the judgement above can fail. Stock's rows with context are wrong (upstream's limits)."""
    case = _non_causal(report, name)
    stock = case["stock"]
    assert stock.wrong(case.tolerance) == {
        r.req_id for r in stock.rows if r.context and r.query > 1
    }


# ---- CUDA-graph replay: EAGLE decodes (and sliding-window decodes) captured once, as
# model-runner V2 captures a uniform-decode batch over its persistent input buffers, then replayed
# on later steps written into those buffers (tests/helpers/graph_replay.py). On ROCm with AITER the
# capture is a real torch.cuda.CUDAGraph (tests/rocm); here the forward runs again on the
# capture's metadata object, and a control shows that stand-in fails a builder that hands the
# kernels copies.

REPLAY_NAMES = [c.name for c in graph_replay.REPLAY_CASES]


def _cases(report: ForwardReport) -> dict[str, dict]:
    return {c["case"]: c for c in report.extras["graph_replays"]}


@pytest.mark.parametrize("kind", runner.KINDS)
@pytest.mark.parametrize("name", REPLAY_NAMES)
def test_replayed_steps_equal_their_references(report, name, kind):
    forward_checks.check_graph_replay(report, name, kind)


def test_the_capture_is_what_this_machine_can_capture(report):
    expected = graph_replay.graph_for(torch.device(report.device)).mode
    for name, case in _cases(report).items():
        for kind in runner.KINDS:
            assert case[kind]["graph"] == expected, (name, kind)


def test_the_replay_cases_are_eagle_and_sliding_window_decodes():
    cases = graph_replay.REPLAY_CASES
    assert any(c.spec_tokens and c.num_padded_reqs for c in cases)
    assert any(c.sliding_window and not c.spec_tokens for c in cases)
    for case in cases:  # every replayed step differs from the capture and from the other
        steps = [graph_replay.capture_step(case), *graph_replay.replay_steps(case)]
        contexts = [tuple(r.context_len for r in step) for step in steps]
        assert len(set(contexts)) == len(contexts), case.name


def test_the_plugin_captures_with_its_own_build(report):
    for name, case in _cases(report).items():
        assert case["plugin"]["own_build"] is own_build_default(), name


def test_sliding_window_decode_tables_are_captured_where_stocks_are(report):
    """0.33's builder writes sliding-window decode tables into its own buffers; the plugin's
    capture has them exactly where stock's has, and the replays above read them."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    writes_tables = hasattr(AiterFlashAttentionMetadataBuilder, "_build_swa_decode_tables")
    window = next(c.name for c in graph_replay.REPLAY_CASES if c.sliding_window)
    assert _cases(report)[window]["stock"]["sliding_window_decode_tables"] == writes_tables
    for name, case in _cases(report).items():
        assert (
            case["plugin"]["sliding_window_decode_tables"]
            == (case["stock"]["sliding_window_decode_tables"])
        ), name


# ---- Attention sinks in the tier: a kernel that drops the sink on the causal new-token call (the
# only call the plugin gives it) fails the tier and the doctor. (The references' sink arithmetic:
# tests/unit/test_sinks.py.)


def test_mutation_a_kernel_that_drops_the_sink_on_causal_calls_fails_the_tier():
    """A CK built with ``sink_value = -inf`` under a mask and no sink flag, without AITER's
    compensation (docs/upstream/aiter.md), drops the sink on the causal new-token call: the
    only call the plugin gives it. The forward tier, with the reference doing the same, must
    find the plugin's extend rows off their references."""
    if not probe.takes_sinks():
        pytest.skip("this release's ROCM_AITER_FA takes no attention sinks (no sink_ptr to pass)")
    report = forward_child.tier_report_or_skip()
    (case,), _ = forward_child.mutated(report, "reference-drops-sink-on-causal-calls")
    plugin = case["plugin"]
    assert plugin.error is None, plugin.traceback or plugin.error
    off = {r.req_id for r in plugin.rows if r.region == "extend" and r.wrong(case.tolerance)}
    assert off == {"new-prompt", "continuation"}
    with pytest.raises(AssertionError):
        forward_checks.check_plugin(case)


def test_a_kernel_that_drops_the_sink_on_the_new_token_call_makes_the_doctor_say_not_working():
    """The doctor's own sink step, with AITER's varlen kernel dropping the sink on causal calls
    (the mutation above): the doctor judges the plugin's output wrong and says fix NOT working."""
    from tests.helpers.doctor_answers import passing_fresh_process_checks
    from vllm_rocm_aiter_plugin.diagnostics import doctor
    from vllm_rocm_aiter_plugin.diagnostics.forward.cases import DOCTOR_SINK_CASE, doctor_steps
    from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardReport

    if not probe.takes_sinks():
        pytest.skip("this release's ROCM_AITER_FA takes no attention sinks: no sink step")
    assert DOCTOR_SINK_CASE in doctor_steps(None, "cpu")
    report = forward_child.tier_report_or_skip()
    (case,), _ = forward_child.mutated(report, "reference-drops-sink-on-causal-calls")
    assert case.case == DOCTOR_SINK_CASE.name
    case.outcomes["registered"] = case["plugin"]  # what ROCM_AITER_FA resolves to here
    forward = doctor.check_forward(ForwardReport(vllm=report.vllm, cases=[case]))
    assert not forward.right, forward.detail
    verdict = doctor.collect({**passing_fresh_process_checks(), "forward": lambda: forward})
    assert verdict.exit_code == 1 and verdict.verdict.startswith("fix NOT working")
