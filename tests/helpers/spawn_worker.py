"""Target for the spawned-process test: what every vLLM worker does at start-up, then report."""

from __future__ import annotations

from typing import Any


def resolve_rocm_aiter_fa(queue: Any) -> None:
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    queue.put(AttentionBackendEnum.ROCM_AITER_FA.get_path())
