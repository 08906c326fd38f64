"""Any-GPU tier: the forward cases on the GPU, vLLM's Triton kernels compiled for real (the
gather loaded from vLLM's source, its merge as the platform dispatches it), only AITER's kernels
replaced by the torch references where aiter is absent. Same cases and assertions as the CPU tier.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import forward_checks, forward_child, graph_replay
from vllm_rocm_aiter_plugin.diagnostics.forward import runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES
from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardReport, ForwardRequest

pytestmark = [pytest.mark.gpu, pytest.mark.forward]


@pytest.fixture(scope="module")
def report(device) -> ForwardReport:
    request = ForwardRequest(list(CASES), device=str(device), kernel_budget=None)
    result = forward_child.run(forward_child.TierRequest(request, graph_replays=True))
    assert result.unavailable is None, result.unavailable
    return result


# tests/rocm/test_aiter_forward.py runs these two tests too, with its own report.
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_forward_case_on_gpu(report, name):
    forward_checks.check_case(report, name)


@pytest.mark.parametrize("kind", runner.KINDS)
@pytest.mark.parametrize("name", [c.name for c in graph_replay.REPLAY_CASES])
def test_graph_replay_on_gpu(report, name, kind):
    """The replay cases on the GPU: a real CUDA graph where AITER's kernels run, else the
    stand-in (the references cannot be captured); every request equals its reference."""
    expected = graph_replay.graph_for(torch.device(report.device)).mode
    forward_checks.check_graph_replay(report, name, kind, graph=expected)
