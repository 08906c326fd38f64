"""The vLLM releases the plugin is tested on, and how a vLLM version string is read: the one
source. What a release does is never listed here: ``diagnostics.probe`` finds it by running it, and
``compat/results.json`` records what it found on each release.
"""

from __future__ import annotations

import re

TESTED: tuple[str, ...] = (
    "0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
    "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0",
    "0.33.0", "0.34.0",
)  # fmt: skip
"""Every release the CPU suite passes on (``compat/results.json``, the table of ``docs/releases.md``),
oldest first."""

CI: tuple[str, ...] = ("0.23.0", TESTED[-1])
"""What ``.ci/run`` tests: the release that defaults Llama to model-runner V2 and still has the
EAGLE crash, and the newest."""

DEMO = "0.23.0"
"""The release the main job (``bash scripts/nox -s demo``) shows: affected by all three bugs."""

OLDEST, NEWEST = TESTED[0], TESTED[-1]

Version = tuple[int, int, int]


def parse(version: str) -> Version | None:
    """``(major, minor, patch)`` of a vLLM version string such as ``0.23.0+rocm700``; None if odd."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


_PRE_RELEASE = re.compile(r"[-_.]?(a|b|c|rc|alpha|beta|pre|preview|dev)[-_.]?\d*", re.IGNORECASE)


def is_pre_release(version: str) -> bool:
    """Whether ``version`` is a pre-release or dev build (``0.33.0rc1``, ``0.20.0.dev3+g1234``),
    which PEP 440 orders before the release its numbers name. A local suffix (``+rocm700``) and
    a post-release (``.post1``) are not."""
    match = re.match(r"^\s*v?\d+\.\d+(?:\.\d+)?((?:\.\d+)*)([^+]*)", version)
    return match is not None and _PRE_RELEASE.match(match.group(2).strip()) is not None


def format_version(version: Version) -> str:
    return ".".join(map(str, version))
