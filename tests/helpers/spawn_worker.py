"""Target for the spawned-process test: what every vLLM worker does at start-up, then report."""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any


def resolve_rocm_aiter_fa(queue: Any) -> None:
    """Put what ROCM_AITER_FA resolves to here and this process's own log (its stdout and stderr,
    where vLLM's logger writes, kept apart from the parent's) in ``queue``."""
    with tempfile.TemporaryFile("w+") as log:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            os.dup2(log.fileno(), stream.fileno())
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        sys.stdout.flush()
        sys.stderr.flush()
        log.seek(0)
        queue.put({"path": AttentionBackendEnum.ROCM_AITER_FA.get_path(), "log": log.read()})
