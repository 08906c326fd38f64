"""Any-GPU tier: the forward cases on the GPU, vLLM's Triton kernels compiled for real (the
gather loaded from vLLM's source, its merge as the platform dispatches it), only AITER's kernels
replaced by the torch references where aiter is absent. Same cases and assertions as the CPU tier.
"""

from __future__ import annotations

import pytest

from tests import forward_checks
from vllm_rocm_aiter_plugin.diagnostics.forward import runner
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import CASES

pytestmark = [pytest.mark.gpu, pytest.mark.forward]


@pytest.fixture(scope="module")
def report(device) -> dict:
    result = runner.run(device=str(device), gather_budget=None, cases=CASES)
    assert "unavailable" not in result, result.get("unavailable")
    return result


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_forward_case_on_gpu(report, name):
    forward_checks.check_case(report, name)
