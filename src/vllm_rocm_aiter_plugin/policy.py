"""When the plugin activates: pure decisions over plain inputs (no vLLM, no torch imports)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vllm_rocm_aiter_plugin import releases
from vllm_rocm_aiter_plugin.envs import PLUGIN_NAME as PLUGIN_NAME
from vllm_rocm_aiter_plugin.envs import SWITCH as SWITCH_ENV
from vllm_rocm_aiter_plugin.envs import Switch, cut
from vllm_rocm_aiter_plugin.releases import format_version, is_pre_release, parse

MIN_SUPPORTED_VLLM = parse(releases.OLDEST) or (0, 0, 0)
"""First release whose ROCM_AITER_FA builder and metadata the plugin knows."""

NEWEST_TESTED_VLLM = parse(releases.NEWEST) or (0, 0, 0)
"""Newest release the test suite has passed against (``releases.TESTED``)."""

BACKEND_QUALNAME = "vllm_rocm_aiter_plugin.backend.PluginAiterFlashAttentionBackend"
OBSERVING_QUALNAME = "vllm_rocm_aiter_plugin.backend.ObservingAiterFlashAttentionBackend"
PLATFORM_QUALNAME = "vllm_rocm_aiter_plugin.platform.AiterRocmPlatform"


def in_tested_range(vllm_version: str, build_verified: bool = False) -> bool:
    """Whether the plugin was tested on this vLLM: a release inside the tested range, or a
    pre-release or dev build of one whose ``build()`` source the plugin verified
    (``build_verified``)."""
    parsed = parse(vllm_version)
    if parsed is None or (is_pre_release(vllm_version) and not build_verified):
        return False
    return MIN_SUPPORTED_VLLM <= parsed <= NEWEST_TESTED_VLLM


def plugin_allowed(allowlist: list[str] | None, name: str = PLUGIN_NAME) -> bool:
    """Whether vLLM's parsed ``VLLM_PLUGINS`` allowlist (None = unset = all) lets ``name`` load."""
    return allowlist is None or name in allowlist


@dataclass(frozen=True)
class Decision:
    """What to do, and the one log line that says so (``level``: a ``logging`` level name);
    ``backend``: the class that takes ``ROCM_AITER_FA`` where it activates."""

    activate: bool
    level: str
    message: str
    backend: str = BACKEND_QUALNAME


def decide_registration(
    vllm_version: str,
    switch: Switch,
    current_backend_path: str,
    stock_backend_path: str,
    build_verified: bool = False,
) -> Decision:
    """Whether the general plugin overrides ``ROCM_AITER_FA``."""
    if switch is Switch.OFF:
        return Decision(
            False, "INFO", f"{SWITCH_ENV} disables the plugin; ROCM_AITER_FA stays stock."
        )
    forced = switch is Switch.FORCE
    if switch is Switch.OBSERVE:
        return _observing(vllm_version, current_backend_path, stock_backend_path)
    if current_backend_path == BACKEND_QUALNAME:
        return Decision(True, "DEBUG", "ROCM_AITER_FA already resolves to the plugin.")
    if current_backend_path != stock_backend_path and not forced:
        return Decision(
            False,
            "WARNING",
            f"ROCM_AITER_FA is already overridden by {current_backend_path}; keeping it, so the "
            f"plugin's split fix is NOT active. Set {SWITCH_ENV}=force to replace it.",
        )
    parsed = parse(vllm_version)
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
            "WARNING",
            f"vLLM {vllm_version} is a pre-release or dev build of {format_version(parsed)} "
            f"whose build() the plugin has not verified, so it is untested; overriding "
            f"ROCM_AITER_FA anyway{replaced}, with vLLM's own build() code and the plugin's "
            f"split. Set {SWITCH_ENV}=force to silence this warning, or {SWITCH_ENV}=0 to "
            f"disable.",
        )
    if parsed > NEWEST_TESTED_VLLM and not forced:
        return Decision(
            True,
            "WARNING",
            f"vLLM {vllm_version} is newer than {format_version(NEWEST_TESTED_VLLM)}, the newest "
            f"release this plugin was tested with; overriding ROCM_AITER_FA anyway{replaced}. "
            f"Set {SWITCH_ENV}=force to silence this warning, or {SWITCH_ENV}=0 to disable.",
        )
    return Decision(
        True,
        "INFO",
        f"ROCM_AITER_FA -> {BACKEND_QUALNAME} (vLLM {vllm_version}; fixes: the EAGLE crash, vLLM "
        f"PR #44936; cached context in model-runner V2 order; NaN from empty context chunks)"
        f"{replaced}.",
    )


def _observing(vllm_version: str, current: str, stock: str) -> Decision:
    """Observe mode: stock's ``ROCM_AITER_FA`` with a builder that counts, where stock serves it
    (another package's override is kept)."""
    if current not in (stock, OBSERVING_QUALNAME, BACKEND_QUALNAME):
        return Decision(
            False,
            "WARNING",
            f"ROCM_AITER_FA is already overridden by {current}; {SWITCH_ENV}=observe counts "
            "nothing there.",
        )
    return Decision(
        True,
        "WARNING",
        f"{SWITCH_ENV}=observe: ROCM_AITER_FA serves stock vLLM's output (its split, build and "
        f"impl; vLLM {vllm_version}), and the plugin only counts the requests stock serves without "
        f"their cached context. Unset {SWITCH_ENV} to serve them with it.",
        OBSERVING_QUALNAME,
    )


def decide_platform(
    switch: Switch, rocm_gpu_present: bool, other_platform_plugins: Iterable[str]
) -> Decision:
    """Whether the platform plugin returns its ``RocmPlatform`` subclass."""
    if switch is Switch.OFF:
        return Decision(False, "DEBUG", f"{SWITCH_ENV} disables the platform plugin.")
    if switch is Switch.OBSERVE:
        return Decision(False, "DEBUG", "observe mode: vLLM's own ROCm platform selects.")
    if not rocm_gpu_present:
        return Decision(False, "DEBUG", "no ROCm GPU; the platform plugin stays inactive.")
    others = sorted(other_platform_plugins)
    if others:
        return Decision(
            False,
            "WARNING",
            f"another out-of-tree platform plugin is installed ({', '.join(others)}); vLLM allows "
            f"only one, so {PLUGIN_NAME} steps aside. The ROCM_AITER_FA fix still applies; "
            f"VLLM_ATTENTION_BACKEND is not honoured. Use --attention-backend instead.",
        )
    return Decision(True, "DEBUG", f"ROCm GPU found; platform -> {PLATFORM_QUALNAME}.")


def _min() -> str:
    return releases.OLDEST


def _unless_forced(forced: bool, reason: str, refusal: str) -> Decision:
    """Stay stock with the WARNING ``refusal``; under ``force``, override with a WARNING that
    names ``reason``."""
    if forced:
        return Decision(
            True,
            "WARNING",
            f"{reason}, but {SWITCH_ENV}=force: overriding ROCM_AITER_FA anyway.",
        )
    return Decision(False, "WARNING", refusal)
