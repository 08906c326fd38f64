"""MI300 tier: runs only on ROCm with a gfx942/gfx950 GPU and an importable aiter; skips (or
fails, with ``--require-hardware``) elsewhere, saying exactly what is missing."""

from __future__ import annotations

import pytest

from tests.helpers import hardware


@pytest.fixture(autouse=True)
def _require_mi300(request: pytest.FixtureRequest) -> None:
    hardware.gate(request.config, hardware.current_mi300_reason())
    if request.node.get_closest_marker("e2e"):
        import os

        hardware.skip_unless_configured(hardware.e2e_reason(os.environ))


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest):
    # Session fixtures run before autouse ones: gate here too, before touching the GPU.
    return hardware.gated_device(request.config, hardware.current_mi300_reason())
