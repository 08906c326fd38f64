"""Any-GPU tier: runs where torch sees a GPU (CUDA or HIP); skips (or fails, with
``--require-hardware``) elsewhere, saying why."""

from __future__ import annotations

import pytest

from tests.helpers import hardware


@pytest.fixture(autouse=True)
def _require_gpu(request: pytest.FixtureRequest) -> None:
    hardware.gate(request.config, hardware.current_gpu_reason())


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest):
    # Session fixtures run before autouse ones: gate here too, before touching the GPU.
    return hardware.gated_device(request.config, hardware.current_gpu_reason())
