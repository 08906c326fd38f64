"""What every forward tier asserts about a case's result (CPU tier, GPU tier, MI300 tier)."""

from __future__ import annotations

from typing import Any

import pytest

from vllm_rocm_aiter_plugin.diagnostics.forward.report import CaseResult, ForwardReport
from vllm_rocm_aiter_plugin.diagnostics.probe import ReleaseFacts, probe_stock_split

WORKSPACE_TOKENS = 32 * 1024  # vLLM's _CP_TOKENS_PER_ITER_ROCM


def causal(case: CaseResult) -> bool:
    return case.configuration.get("causal", True)


def expected_stock_wrong(case: CaseResult, facts: ReleaseFacts) -> set[str]:
    """Stock's rows that must be wrong: rows with context in its prefill region (that kernel
    attends to the new tokens only), and, where this release's merge makes NaN of two empty
    states, rows without context in an extend region of two chunks or more. On a non-causal
    batch, every row with context and more than one new token (the prefill kernel drops the
    context, the extend path runs causally: ``docs/upstream/README.md``). With attention sinks
    and no sliding window, every row of an extend region with context chunks (the merges count
    the sink once per call: ``docs/upstream/README.md``), unless this release's own code counts
    it once (vLLM 0.34.0)."""
    stock = case["stock"]
    if not causal(case):
        return {r.req_id for r in stock.rows if r.context and r.query > 1}
    wrong = {r.req_id for r in stock.rows if r.region == "prefill" and r.context}
    if facts.merge_nan and stock.chunks >= 2:
        wrong |= {r.req_id for r in stock.rows if r.region == "extend" and not r.context}
    sinks = case.configuration.get("sinks") and not case.configuration.get("sliding_window")
    if sinks and stock.chunks and not facts.counts_sink_once:
        wrong |= {r.req_id for r in stock.rows if r.region == "extend"}
    return wrong


def check_plugin(case: CaseResult) -> None:
    """Every request of the plugin's step equals its reference; no NaN or inf anywhere. On a
    non-causal batch: the plugin's regions and outputs are stock's, and every row without
    context equals its non-causal reference (rows with context are wrong in stock's paths
    alike: :func:`expected_stock_wrong`)."""
    plugin = case["plugin"]
    assert plugin.error is None, plugin.traceback or plugin.error
    assert len(plugin.rows) == len(case.order_ids)
    assert plugin.nan() == set(), f"{case.case}: NaN or inf in the plugin's output"
    if causal(case):
        assert plugin.wrong(case.tolerance) == set(), case.case
        return
    stock = case["stock"]
    assert plugin.regions == stock.regions, case.case
    assert [r.error for r in plugin.rows] == [r.error for r in stock.rows]
    context_free = {r.req_id for r in plugin.rows if not r.context}
    assert context_free and not plugin.wrong(case.tolerance) & context_free


def check_stock(case: CaseResult, facts: ReleaseFacts) -> None:
    """Stock is wrong exactly where it drops context (or crashes, on the affected releases)."""
    stock = case["stock"]
    if stock.error:  # the EAGLE crash: a pure-decode batch without the upper bound
        assert probe_stock_split().affected, stock.error
        assert stock.error.startswith("build raises AssertionError"), stock.error
        return
    assert stock.wrong(case.tolerance) == expected_stock_wrong(case, facts), case.case


def check_exposure(case: CaseResult, facts: ReleaseFacts) -> None:
    """Observe mode serves stock's output (its regions, errors and NaN, or its crash) and counts
    the rows of stock's prefill region that have context, with their cached tokens; the plugin,
    right on every row, counts the same (none on a non-causal step, whose rows with context no
    region serves right). Where nothing else makes a stock row wrong (a causal step without
    sinks and without empty merges), the counted rows are exactly the rows off the reference."""
    stock, observe, plugin = case["stock"], case["observe"], case["plugin"]
    assert observe.error == stock.error, case.case
    if stock.error:
        return
    assert [(r.region, r.error, r.nan) for r in observe.rows] == [
        (r.region, r.error, r.nan) for r in stock.rows
    ], case.case
    lost = stock.served_without_context() if causal(case) else []
    counted = {"request_steps": len(lost), "context_tokens": sum(r.context for r in lost)}
    assert observe.counted == counted and plugin.counted == counted, (case.case, counted)
    sinks = case.configuration.get("sinks") and stock.chunks
    if causal(case) and not sinks and not (facts.merge_nan and stock.chunks >= 2):
        assert {r.req_id for r in lost} == stock.wrong(case.tolerance), case.case


def check_chunks(case: CaseResult) -> None:
    """On a V2-ordered step, no more context chunks than stock's for the same requests in V1
    order (where this vLLM has a V1 runner), each within the workspace."""
    plugin = case["plugin"]
    assert plugin.largest_chunk_tokens <= WORKSPACE_TOKENS
    if case.order != "v2" or case.v1_stock_chunks is None:
        return
    if isinstance(case.v1_stock_chunks, str):  # stock cannot build it (the EAGLE crash)
        assert probe_stock_split().affected, case.v1_stock_chunks
        return
    assert plugin.chunks <= case.v1_stock_chunks, case.case


def case_of(report: ForwardReport, name: str) -> CaseResult:
    """The case ``name`` of ``report``; a skip saying why where it did not run: absent (a V1-order
    case on a vLLM without the V1 runner) or set aside (``not_applicable``)."""
    case, facts = report.case(name), report.facts
    if case is None:
        assert facts is not None and facts.no_v1_runner, f"{name} is missing from the report"
        pytest.skip(facts.no_v1_runner)
    if case.not_applicable:
        pytest.skip(case.not_applicable)
    return case


def check_case(report: ForwardReport, name: str) -> None:
    """Every assertion of the forward tiers on one case of ``report``."""
    case = case_of(report, name)
    check_plugin(case)
    assert report.facts is not None
    check_stock(case, report.facts)
    check_chunks(case)


def bad(rows: list[dict[str, Any]], tolerance: float) -> set[str]:
    """Requests of a graph replay's rows whose output is not finite or off the reference."""
    return {r["req_id"] for r in rows if r["nan"] or r["error"] > tolerance}


def check_graph_replay(
    report: ForwardReport, name: str, kind: str, graph: str | None = None
) -> None:
    """A CUDA-graph replay case (``tests/helpers/graph_replay.py``) for ``kind``'s backend:
    it ran as ``graph`` (``cuda graph``, ``eager stand-in``; None: either), the capture is all
    decodes, every replayed step's requests equal their references with no NaN; where the eager
    stand-in ran, the frozen control (the capture's metadata copied, as a builder that copies
    would leave it) is off on every replay, so the stand-in can fail."""
    case = next(c for c in report.extras["graph_replays"] if c["case"] == name)
    result = case[kind]
    assert graph is None or result.get("graph") == graph, result
    assert "error" not in result, result["error"]
    assert result["regions"][1:] == [0, 0], result["regions"]
    tolerance = case["tolerance"]
    assert len(result["replays"]) == 2
    for rows in result["replays"]:
        assert bad(rows, tolerance) == set(), (name, kind, rows)
    if result["graph"] == "eager stand-in":
        assert len(result["frozen_replays"]) == len(result["replays"])
        for rows in result["frozen_replays"]:
            assert bad(rows, tolerance), (name, kind, rows)
