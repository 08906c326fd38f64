"""pytest plugin for running vLLM's own tests on a machine without an accelerator
(``scripts/upstream_check.py``): every test carries vLLM's ``skip_global_cleanup`` marker, which
vLLM's conftest reads to skip its accelerator cleanup after each test (it fails without one)."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)
