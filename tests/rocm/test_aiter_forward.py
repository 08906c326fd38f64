"""MI300 tier: the forward cases of the CPU tier, on real AITER kernels and vLLM's own ROCm
kernels (``cp_mha_gather_cache``, the ROCm merge), in this process on the GPU.
"""

from __future__ import annotations

import pytest

from tests.helpers import forward_checks, forward_child, graph_replay
from tests.helpers.forward_cases import CASES
from vllm_rocm_aiter_plugin.diagnostics.forward import runner
from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardReport, ForwardRequest

pytestmark = [pytest.mark.rocm, pytest.mark.mi300, pytest.mark.forward]


@pytest.fixture(scope="module")
def report(device) -> ForwardReport:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    request = ForwardRequest(list(CASES), device=str(device), kernel_budget=None)
    result = forward_child.run(forward_child.TierRequest(request, graph_replays=True))
    assert result.unavailable is None, result.unavailable
    assert result.references == [], f"real kernels expected, got references {result.references}"
    return result


# The same two tests as tests/gpu/test_forward_gpu.py, by design: each tier runs the
# shared case list with its own expectations (duplicates reports the pair; the checks
# live in forward_checks.py).
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_forward_case_on_aiter(report, name):
    forward_checks.check_case(report, name)


@pytest.mark.parametrize("kind", runner.KINDS)
@pytest.mark.parametrize("name", [c.name for c in graph_replay.REPLAY_CASES])
def test_graph_replay_on_aiter(report, name, kind):
    """EAGLE and sliding-window decodes captured in a real CUDA graph (HIP), replayed on two
    later steps written into the persistent inputs: every request equals its reference."""
    forward_checks.check_graph_replay(report, name, kind, graph="cuda graph")
