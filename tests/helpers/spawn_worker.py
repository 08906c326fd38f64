"""Target for the spawned-process test: what every vLLM worker does at start-up, then report."""

from __future__ import annotations

import os
import tempfile
from typing import Any


def resolve_rocm_aiter_fa(queue: Any) -> None:
    """Put what ROCM_AITER_FA resolves to here and this process's own log (its stderr, kept apart
    from the parent's) in ``queue``."""
    with tempfile.TemporaryFile("w+") as log:
        os.dup2(log.fileno(), 2)
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        log.seek(0)
        queue.put({"path": AttentionBackendEnum.ROCM_AITER_FA.get_path(), "log": log.read()})
