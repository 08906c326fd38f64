"""When the plugin activates: pure decisions over plain inputs (no vLLM, no torch imports).

Every branch here is decided from strings and booleans so that each one is tested on CPU. The
callers (``__init__``, the doctor) gather the inputs and log the decision.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass

from vllm_rocm_aiter_plugin import releases
from vllm_rocm_aiter_plugin.envs import PLUGIN_NAME as PLUGIN_NAME
from vllm_rocm_aiter_plugin.envs import SWITCH as SWITCH_ENV
from vllm_rocm_aiter_plugin.envs import Switch, cut


def parse_version_strict(version: str) -> tuple[int, int, int]:
    major, minor, patch = releases.version_tuple(version)
    return major, minor, patch


MIN_SUPPORTED_VLLM = parse_version_strict(releases.OLDEST)
"""First release whose ROCM_AITER_FA builder and metadata the plugin knows."""

NEWEST_TESTED_VLLM = parse_version_strict(releases.NEWEST)
"""Newest release the test suite has passed against (``releases.TESTED``)."""

LOGGER_NAME = "vllm.rocm_aiter_plugin"
"""Under ``vllm.`` so vLLM's log handler, format and ``VLLM_LOGGING_LEVEL`` apply."""

BACKEND_QUALNAME = "vllm_rocm_aiter_plugin.backend.PluginAiterFlashAttentionBackend"
PLATFORM_QUALNAME = "vllm_rocm_aiter_plugin.platform.AiterRocmPlatform"


def parse_version(version: str) -> tuple[int, int, int] | None:
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


def format_version(version: tuple[int, int, int]) -> str:
    return ".".join(map(str, version))


def in_tested_range(vllm_version: str, build_verified: bool = False) -> bool:
    """Whether the plugin was tested on this vLLM: a release inside the tested range, or a
    pre-release or dev build of one whose ``build()`` source the plugin verified
    (``build_verified``)."""
    parsed = parse_version(vllm_version)
    if parsed is None or (is_pre_release(vllm_version) and not build_verified):
        return False
    return MIN_SUPPORTED_VLLM <= parsed <= NEWEST_TESTED_VLLM


def plugin_allowed(allowlist: list[str] | None, name: str = PLUGIN_NAME) -> bool:
    """Whether vLLM's parsed ``VLLM_PLUGINS`` allowlist (None = unset = all) lets ``name`` load."""
    return allowlist is None or name in allowlist


@dataclass(frozen=True)
class Decision:
    """What to do, and the one log line that says so."""

    activate: bool
    level: int
    message: str


def decide_registration(
    vllm_version: str,
    switch: Switch,
    current_backend_path: str,
    stock_backend_path: str,
    build_verified: bool = False,
) -> Decision:
    """Whether the general plugin overrides ``ROCM_AITER_FA``.

    ``current_backend_path`` is what the registry resolves ROCM_AITER_FA to now;
    ``stock_backend_path`` is vLLM's own class path for it; ``build_verified`` whether the
    installed ``build()`` source is one the plugin verified (it decides only for a pre-release
    or dev build, which counts as its release only then, and else as untested: PEP 440 orders it
    before its release).
    """
    if switch is Switch.OFF:
        return Decision(
            False, logging.INFO, f"{SWITCH_ENV} disables the plugin; ROCM_AITER_FA stays stock."
        )
    forced = switch is Switch.FORCE
    if current_backend_path == BACKEND_QUALNAME:
        return Decision(True, logging.DEBUG, "ROCM_AITER_FA already resolves to the plugin.")
    if current_backend_path != stock_backend_path and not forced:
        return Decision(
            False,
            logging.WARNING,
            f"ROCM_AITER_FA is already overridden by {current_backend_path}; keeping it, so the "
            f"plugin's split fix is NOT active. Set {SWITCH_ENV}=force to replace it.",
        )
    parsed = parse_version(vllm_version)
    if parsed is None:
        return _unless_forced(
            forced,
            f"vLLM version {vllm_version!r} is unparsable",
            f"vLLM reports its version as {cut(repr(vllm_version))}, which cannot be parsed (a "
            f"source or dev build?), so the plugin leaves ROCM_AITER_FA stock. Set "
            f"{SWITCH_ENV}=force to take the fix anyway, then run `vllm-rocm-aiter-plugin "
            f"doctor`, which checks the builder on this vLLM.",
        )
    untested_pre_release = is_pre_release(vllm_version) and not build_verified
    if parsed < MIN_SUPPORTED_VLLM or (untested_pre_release and parsed <= MIN_SUPPORTED_VLLM):
        return _unless_forced(
            forced,
            f"vLLM {vllm_version} is below {_min()}",
            f"vLLM {vllm_version} is older than {_min()}, the oldest release this plugin "
            f"was verified on; ROCM_AITER_FA stays stock. Its split has no EAGLE crash but can "
            f"drop context in model-runner V2 order: set {SWITCH_ENV}=force to override anyway, "
            f"and run `vllm-rocm-aiter-plugin doctor`, which checks the builder on this vLLM.",
        )
    replaced = (
        "" if current_backend_path == stock_backend_path else f" (replacing {current_backend_path})"
    )
    if untested_pre_release and parsed <= NEWEST_TESTED_VLLM and not forced:
        return Decision(
            True,
            logging.WARNING,
            f"vLLM {vllm_version} is a pre-release or dev build of {format_version(parsed)} "
            f"whose build() the plugin has not verified, so it is untested; overriding "
            f"ROCM_AITER_FA anyway{replaced}, with vLLM's own build() code and the plugin's "
            f"split. Set {SWITCH_ENV}=force to silence this warning, or {SWITCH_ENV}=0 to "
            f"disable.",
        )
    if parsed > NEWEST_TESTED_VLLM and not forced:
        return Decision(
            True,
            logging.WARNING,
            f"vLLM {vllm_version} is newer than {format_version(NEWEST_TESTED_VLLM)}, the newest "
            f"release this plugin was tested with; overriding ROCM_AITER_FA anyway{replaced}. "
            f"Set {SWITCH_ENV}=force to silence this warning, or {SWITCH_ENV}=0 to disable.",
        )
    return Decision(
        True,
        logging.INFO,
        f"ROCM_AITER_FA -> {BACKEND_QUALNAME} (vLLM {vllm_version}; fixes: the EAGLE crash, vLLM "
        f"PR #44936; cached context in model-runner V2 order; NaN from empty context chunks)"
        f"{replaced}.",
    )


def decide_platform(
    switch: Switch, rocm_gpu_present: bool, other_platform_plugins: Iterable[str]
) -> Decision:
    """Whether the platform plugin returns its ``RocmPlatform`` subclass."""
    if switch is Switch.OFF:
        return Decision(False, logging.DEBUG, f"{SWITCH_ENV} disables the platform plugin.")
    if not rocm_gpu_present:
        return Decision(False, logging.DEBUG, "no ROCm GPU; the platform plugin stays inactive.")
    others = sorted(other_platform_plugins)
    if others:
        return Decision(
            False,
            logging.WARNING,
            f"another out-of-tree platform plugin is installed ({', '.join(others)}); vLLM allows "
            f"only one, so {PLUGIN_NAME} steps aside. The ROCM_AITER_FA fix still applies; "
            f"VLLM_ATTENTION_BACKEND is not honoured. Use --attention-backend instead.",
        )
    return Decision(True, logging.DEBUG, f"ROCm GPU found; platform -> {PLATFORM_QUALNAME}.")


def _min() -> str:
    return format_version(MIN_SUPPORTED_VLLM)


def _unless_forced(forced: bool, reason: str, refusal: str) -> Decision:
    """Stay stock with the WARNING ``refusal``; under ``force``, override with a WARNING that
    names ``reason``."""
    if forced:
        return Decision(
            True,
            logging.WARNING,
            f"{reason}, but {SWITCH_ENV}=force: overriding ROCM_AITER_FA anyway.",
        )
    return Decision(False, logging.WARNING, refusal)
