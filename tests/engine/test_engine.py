"""vLLM's engine serves every request through ``ROCM_AITER_FA`` as the run's oracle serves it
(``CPU_ATTN`` where this vLLM compiles its CPU ops), with the plugin; stock does not, where the
installed release has the bugs the plugin fixes. Stock serves in observe mode (its own split,
build and impl: its output), which counts the requests it serves without their context."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import summary_lines
from tests.helpers import engine_comparison, vllm_releases
from tests.helpers.engine_comparison import Comparison
from tests.helpers.engine_runs import ENGINE_RUNS, ENGINE_RUNS_BY_NAME, save_models
from vllm_rocm_aiter_plugin.diagnostics import probe

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict]]:
    models = Path(tmp_path_factory.mktemp("engine-models"))
    save_models(models)
    return engine_comparison.serve_all(models)


def comparisons(served: dict[str, dict[str, dict]], server: str) -> dict[str, Comparison]:
    return {
        w.name: engine_comparison.compare(
            served[server][w.name], served[engine_comparison.oracle_of(w)][w.name]
        )
        for w in ENGINE_RUNS
    }


@pytest.fixture(scope="module")
def verdicts(served: dict, request: pytest.FixtureRequest) -> dict[str, dict[str, Comparison]]:
    result = {server: comparisons(served, server) for server in ("plugin", "observe")}
    line = engine_comparison.summary_line(
        vllm_releases.release(),
        list(result["plugin"].values()),
        list(result["observe"].values()),
        {w.name: engine_comparison.oracle_of(w) for w in ENGINE_RUNS},
    )
    summary_lines(request.config).append(line)
    return result


@pytest.mark.parametrize("run", [w.name for w in ENGINE_RUNS])
def test_the_plugin_serves_every_request_as_the_oracle(verdicts: dict, run: str) -> None:
    verdict = verdicts["plugin"][run]
    assert verdict.error is None, verdict.error
    oracle = engine_comparison.oracle_of(ENGINE_RUNS_BY_NAME[run])
    assert all(verdict.equal), (
        f"{run} ({ENGINE_RUNS_BY_NAME[run].covers}): requests "
        f"{[i for i, ok in enumerate(verdict.equal) if not ok]} differ from {oracle} "
        f"(largest logprob difference {verdict.largest_logprob_difference:.3g})"
    )


def test_stock_loses_context_in_model_runner_v2_order_where_its_split_does(verdicts: dict) -> None:
    """The tier can fail: where the installed stock split puts a row with context in its prefill
    region on a V2-ordered step, stock serves some chunked-prefill or prefix-hit request wrong."""
    verdict = verdicts["observe"]["v2-order"]
    if probe.probe_stock_v2_order().affected:
        assert verdict.error is None, verdict.error
        assert not all(verdict.equal), "stock served every request as the oracle"
    else:
        assert all(verdict.equal), f"stock differs from the oracle: {verdict.equal}"


def test_stock_stops_on_eagle_where_its_split_asserts(verdicts: dict) -> None:
    """Where the installed stock split asserts on EAGLE's pure-decode metadata, the engine stops
    serving the EAGLE run (0.20.0 to 0.23.0); elsewhere it serves it."""
    verdict = verdicts["observe"]["eagle"]
    if probe.probe_stock_split().affected:
        assert verdict.error is not None and "AssertionError" in verdict.error, verdict.error
    else:
        assert verdict.error is None, verdict.error


def test_rocm_aiter_fa_served_the_layers_and_paths_each_run_needs(served: dict) -> None:
    """The runs under test were ROCM_AITER_FA's (the plugin's backend, or stock's), on every layer
    the draft's included, and EAGLE's verify rows reached AITER's ``unified_attention``, each
    call agreeing with the reference where AITER's own Triton kernel ran."""
    for server, backend in (("plugin", "Plugin"), ("observe", "Observing")):
        for name, result in served[server].items():
            usage = result["aiter_fa"]
            assert usage["backend"].startswith(f"vllm_rocm_aiter_plugin.backend.{backend}"), (
                server, name, usage,
            )  # fmt: skip
    plugin = served["plugin"]
    before = plugin["v2-order"]["aiter_fa"]
    after = plugin["eagle"]["aiter_fa"]
    assert after["layers"] - before["layers"] == 3, "the target's 2 layers and the draft's 1"
    calls = after["unified_attention"]["calls"] - before["unified_attention"]["calls"]
    assert calls > 0, "no EAGLE verify row reached unified_attention"
    for result in plugin.values():
        assert result["aiter_fa"]["unified_attention"]["cross_check_disagreements"] == 0


def test_observe_mode_and_the_plugin_count_the_same_and_a_count_means_a_wrong_request(
    verdicts: dict, served: dict
) -> None:
    """On every run the plugin and observe mode count the same request-steps, batch by batch,
    and observe mode's count is above 0 exactly where some request it served (stock's output)
    differs from the oracle's."""
    for run in ENGINE_RUNS:
        observed, fixed = served["observe"][run.name], served["plugin"][run.name]
        if "error" in observed:  # stock's EAGLE crash: nothing served to count
            continue
        assert observed["exposure"] == fixed["exposure"], run.name
        counted = observed["exposure"][-1] > 0
        assert counted is not all(verdicts["observe"][run.name].equal), (run.name, observed)


def test_a_prefix_cache_hit_on_an_exposed_requests_blocks_is_wrong_though_never_counted(
    verdicts: dict, served: dict
) -> None:
    """The reach of one exposed chunk: its wrong output became K/V of the next layer, cached;
    a later request that reuses those blocks, alone in its steps (nothing of it counted),
    differs from the oracle in observe mode. With the plugin it is right."""
    first, _hit = ENGINE_RUNS_BY_NAME["prefix-reach"].batches
    counts = served["observe"]["prefix-reach"]["exposure"]
    assert counts[0] > 0 and counts[1] == counts[0], counts
    assert not verdicts["observe"]["prefix-reach"].equal[len(first)]
    assert all(verdicts["plugin"]["prefix-reach"].equal)
