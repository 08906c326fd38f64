"""The vLLM releases the plugin is tested on, the facts known of each, and how a vLLM version
string is read: the one source.
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

NON_CAUSAL_V2_BATCHES: frozenset[str] = frozenset({"0.33.0", "0.34.0"})
"""Of the CI releases, those whose model-runner V2 builds non-causal batches (its
``build_attn_metadata`` takes ``causal``; read off the 0.23.0, 0.33.0 and 0.34.0 wheels, the
others not read). The coverage matrix of ``docs/testing.md`` reads it; a test checks it against
the installed release."""

SHUFFLE_LAYOUT_RUNS: frozenset[str] = frozenset({"0.33.0", "0.34.0"})
"""Of the CI releases, those whose shuffle KV-cache layout stock itself runs right: K and V as
dense planes of pages (``customize_spec`` head slots, LHBNC), which AITER's shuffle decode reads;
0.23.0 keeps them interleaved within each block (``get_kv_cache_shape``). The coverage matrix
reads it; a test checks it against the installed release."""

SINKS: frozenset[str] = frozenset({"0.23.0", "0.33.0", "0.34.0"})
"""Of the CI releases, those whose ROCM_AITER_FA takes attention sinks (``supports_sink``, read
off the 0.23.0, 0.33.0 and 0.34.0 wheels). The coverage matrix reads it; a test checks it against the
installed release."""

SINK_COUNTED_ONCE_UPSTREAM: frozenset[str] = frozenset({"0.34.0"})
"""Of the CI releases, those whose own ``extend_forward`` passes the sink to the new-token call
only (``sink_ptr=None`` on the context-chunk calls, read off the 0.34.0 wheel): the plugin steps
aside there. The plugin finds it by running vLLM's code (``impl.vllm_counts_sink_once``); a test
checks that against this fact."""

V1_RUNNER_REMOVED: frozenset[str] = frozenset({"0.34.0"})
"""Of the CI releases, those without model-runner V1 (read off the 0.34.0 wheel): V2 serves every
model. The forward tier finds it through vLLM's module (``model_runner.why_no_v1_order``); a test
checks that against this fact."""

DEMO = "0.23.0"
"""The release the main job (``bash scripts/nox -s demo``) shows: affected by all three bugs."""

EAGLE_CRASH: frozenset[str] = frozenset(
    {"0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0"}
)
"""Stock's split asserts ``seq_lens_cpu_upper_bound`` before its pure-decode return (read off the
wheels; fixed in 0.24.0 by PR #44936)."""

MERGE_NAN_OF_EMPTY_STATES: frozenset[str] = frozenset(
    {"0.20.0", "0.20.1", "0.20.2", "0.21.0", "0.22.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0",
     "0.25.1"}
)  # fmt: skip
"""vLLM's Triton ``merge_attn_states`` lacks the both-empty guard (added in 0.26.0): two empty
states merge to NaN (read off the wheels, and run under the Triton interpreter)."""


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
