"""Run Python snippets in fresh interpreters, the way vLLM starts its processes, through the
commands' own child protocol (``diagnostics.child``): a snippet reports with ``report(obj)``."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping

from vllm_rocm_aiter_plugin.diagnostics import child

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLEARED = (
    "VLLM_PLUGINS",
    "VLLM_ROCM_AITER_PLUGIN",
    "VLLM_ROCM_AITER_PLUGIN_OWN_BUILD",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_ROCM_USE_AITER",
    "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT",
    "VLLM_ROCM_AITER_PLUGIN_REQUIRE_HARDWARE",
)
"""Variables a child starts without: the plugin's and the vLLM ones it reads."""

PRELUDE = (
    "import logging\n"
    "logging.basicConfig(level=logging.DEBUG)  # vLLM >= 0.30 configures its logging lazily\n"
    "from vllm_rocm_aiter_plugin.diagnostics.child import report\n"
)


def scrubbed_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``CLEARED``, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    env.update(extra or {})
    return env


def run_child(
    code: str, env: Mapping[str, str | None] | None = None, timeout: float = 300
) -> child.ChildResult:
    """Run ``code`` in a new interpreter started in the repository; the plugin's variables start
    unset; vLLM logs at DEBUG so tests can read its plugin loader's lines."""
    overrides: dict[str, str | None] = dict.fromkeys(CLEARED)
    overrides.update(env or {})
    overrides.setdefault("VLLM_LOGGING_LEVEL", os.environ.get("VLLM_LOGGING_LEVEL", "DEBUG"))
    done = child.run(
        ["-c", PRELUDE + textwrap.dedent(code)], env=overrides, cwd=REPO_ROOT, timeout=timeout
    )
    if done.result is None:
        raise AssertionError(
            f"child exited {done.returncode} without a result:\n{done.output[-4000:]}"
        )
    return done
