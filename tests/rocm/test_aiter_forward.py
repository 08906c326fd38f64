"""MI300 tier: the any-GPU tier's forward tests (``tests/gpu/test_forward_gpu.py``, the CPU tier's
cases) on real AITER kernels and vLLM's own ROCm kernels (``cp_mha_gather_cache``, the ROCm merge),
in this process on the GPU; the graph replays in a real CUDA graph (HIP).
"""

from __future__ import annotations

import pytest

from tests.gpu.test_forward_gpu import test_forward_case_on_gpu as test_forward_case_on_aiter
from tests.gpu.test_forward_gpu import test_graph_replay_on_gpu as test_graph_replay_on_aiter
from tests.helpers import forward_child
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES
from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardReport, ForwardRequest

pytestmark = [pytest.mark.rocm, pytest.mark.mi300, pytest.mark.forward]
__all__ = ["test_forward_case_on_aiter", "test_graph_replay_on_aiter"]


@pytest.fixture(scope="module")
def report(device) -> ForwardReport:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    request = ForwardRequest(list(CASES), device=str(device), kernel_budget=None)
    result = forward_child.run(forward_child.TierRequest(request, graph_replays=True))
    assert result.unavailable is None, result.unavailable
    assert result.references == [], f"real kernels expected, got references {result.references}"
    return result
