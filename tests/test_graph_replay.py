"""CUDA-graph replay in the forward tier: EAGLE decodes (and sliding-window decodes) captured
once, as model-runner V2 captures a uniform-decode batch over its persistent input buffers, then
replayed on later steps written into those buffers; each request's output judged against its
dense reference (``tests/helpers/graph_replay.py``).

On ROCm with AITER the capture is a real ``torch.cuda.CUDAGraph`` (``tests/rocm``); here, the
forward runs again on the capture's metadata object, and a control shows that stand-in fails a
builder that hands the kernels copies.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import forward_background, forward_checks, graph_replay
from vllm_rocm_aiter_plugin.builder import own_build_enabled
from vllm_rocm_aiter_plugin.diagnostics.forward import runner

pytestmark = [pytest.mark.cpu, pytest.mark.forward]

NAMES = [c.name for c in graph_replay.REPLAY_CASES]


@pytest.fixture(scope="module")
def report() -> dict:
    return forward_background.report_or_skip()


def _cases(report: dict) -> dict[str, dict]:
    return {c["case"]: c for c in report["graph_replays"]}


@pytest.mark.parametrize("kind", runner.KINDS)
@pytest.mark.parametrize("name", NAMES)
def test_replayed_steps_equal_their_references(report, name, kind):
    forward_checks.check_graph_replay(report, name, kind)


def test_the_capture_is_what_this_machine_can_capture(report):
    expected = graph_replay.graph_for(torch.device(report["device"])).mode
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
    body = "own" if own_build_enabled() else "vllm-build"
    for name, case in _cases(report).items():
        assert case["plugin"].get("builder_body") == body, name


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
