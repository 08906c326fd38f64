"""Run Python snippets in fresh interpreters, the way vLLM starts its processes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping

from vllm_rocm_aiter_plugin.diagnostics.probe import ChildResult, run_python

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLEARED = (
    "VLLM_PLUGINS",
    "VLLM_ROCM_AITER_PLUGIN",
    "VLLM_ROCM_AITER_PLUGIN_FAST_BUILD",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE",
)
"""Variables a child starts without: the plugin's and the vLLM ones it reads."""


def scrubbed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``CLEARED``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(extra or {})
    return env


def check_generated(script: str, timeout: float = 300) -> None:
    """``python SCRIPT --check`` in the repository, with this interpreter: it exits 0 when what
    the script generates into the docs is current."""
    proc = subprocess.run(
        [sys.executable, script, "--check"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr


def run_child(
    code: str, env: Mapping[str, str | None] | None = None, timeout: float = 300
) -> ChildResult:
    """Run ``code`` in a new interpreter (the doctor's own child protocol, ``probe.run_python``);
    it reports by calling ``report(obj)``. The plugin's variables start unset; vLLM logs at DEBUG
    so tests can read its plugin loader's lines."""
    overrides: dict[str, str | None] = dict.fromkeys(CLEARED)
    overrides.update(env or {})
    overrides.setdefault("VLLM_LOGGING_LEVEL", os.environ.get("VLLM_LOGGING_LEVEL", "DEBUG"))
    prelude = (
        "import logging\n"
        "logging.basicConfig(level=logging.DEBUG)  # vLLM >= 0.30 configures its logging lazily\n"
    )
    child = run_python(
        textwrap.dedent(code), overrides, prelude=prelude, cwd=REPO_ROOT, timeout=timeout
    )
    if child.result is None:
        raise AssertionError(
            f"child exited {child.returncode} without a result:\n{child.output[-4000:]}"
        )
    return child
