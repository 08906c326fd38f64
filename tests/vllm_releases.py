"""Facts about vLLM releases that the tests check against, written independently of the plugin."""

from __future__ import annotations

import vllm

# Releases whose split asserts seq_lens_cpu_upper_bound before the pure-decode return
# (read off the PyPI wheels; fixed in 0.24.0 by PR #44936).
AFFECTED_RELEASES = frozenset(
    {"0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0"}
)


def release() -> str:
    """The installed vLLM's release, without local or dev suffixes."""
    return vllm.__version__.split("+")[0].split(".dev")[0]


def installed_is_affected() -> bool:
    return release() in AFFECTED_RELEASES
