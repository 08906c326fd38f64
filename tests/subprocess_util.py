"""Run Python snippets in fresh interpreters, the way vLLM starts its processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MARK = "@@RESULT@@"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class ChildResult:
    returncode: int
    result: Any
    output: str


def run_child(
    code: str, env: Mapping[str, str | None] | None = None, timeout: float = 300
) -> ChildResult:
    """Run ``code`` in a new interpreter; it reports by calling ``report(obj)`` (JSON)."""
    child_env = dict(os.environ)
    for key in ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN", "VLLM_ATTENTION_BACKEND"):
        child_env.pop(key, None)
    for key, value in (env or {}).items():
        if value is None:
            child_env.pop(key, None)
        else:
            child_env[key] = value
    child_env.setdefault("VLLM_LOGGING_LEVEL", "DEBUG")
    prelude = (
        "import json, logging\n"
        "logging.basicConfig(level=logging.DEBUG)  # vLLM >= 0.30 configures its logging lazily\n"
        f"def report(obj):\n    print({MARK!r} + json.dumps(obj), flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        cwd=REPO_ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    output = proc.stdout + proc.stderr
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            result = json.loads(line[len(MARK) :])
    if result is None:
        raise AssertionError(f"child exited {proc.returncode} without a result:\n{output[-4000:]}")
    return ChildResult(proc.returncode, result, output)
