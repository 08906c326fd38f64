"""What vLLM's entry points do. Cheap to import: no torch, no vLLM at import time."""

from __future__ import annotations

import logging
import os
import threading

from vllm_rocm_aiter_plugin import envs, exposure, policy
from vllm_rocm_aiter_plugin.log import logger

_lock = threading.Lock()
_registration_attempted = False
_platform_decision_logged = False

KFD_DEVICE = "/dev/kfd"


def register() -> None:
    """Override ``ROCM_AITER_FA`` (idempotent, never raises)."""
    global _registration_attempted
    with _lock:
        if _registration_attempted:
            return
        _registration_attempted = True
        try:
            _register()
        except Exception as exc:  # vLLM's loader must never see an exception from us
            logger().warning(
                "vllm-rocm-aiter-plugin could not register its ROCM_AITER_FA backend (%s: %s); "
                "stock ROCM_AITER_FA stays in use and the plugin's split fixes are NOT active. "
                "Run `vllm-rocm-aiter-plugin doctor` for details.",
                type(exc).__name__,
                exc,
            )


def vllm_version_for_policy() -> tuple[str, bool]:
    """What the activation policy decides on: ``vllm.__version__`` as the running vLLM reports it
    (not its package metadata: a source build may differ), and, for a pre-release or dev build
    only, whether its ``build()`` source is one the plugin verified (importing the builder costs
    an import of vLLM's ROCM_AITER_FA module, paid only there). The doctor uses the same."""
    from vllm import __version__ as vllm_version

    from vllm_rocm_aiter_plugin.releases import is_pre_release

    verified = False
    if is_pre_release(vllm_version):
        try:
            from vllm_rocm_aiter_plugin.builder import verified_release

            verified = verified_release() is not None
        except Exception:  # the builder cannot load here: not verified, so untested
            verified = False
    return vllm_version, verified


def _register() -> None:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name in (envs.SWITCH, envs.OWN_BUILD):  # what the plugin cannot act on as asked
        problem = envs.read(name).problem
        if problem:
            logger().warning("%s", problem)
    exposure.open_channel()  # the first process's folder for /metrics; its children inherit it
    backend = AttentionBackendEnum.ROCM_AITER_FA
    vllm_version, build_verified = vllm_version_for_policy()
    decision = policy.decide_registration(
        vllm_version, envs.read(envs.SWITCH).value, backend.get_path(), backend.value,
        build_verified,
    )  # fmt: skip
    if decision.activate and backend.get_path() != decision.backend:
        register_backend(backend, decision.backend)
    _log(decision)


def platform_plugin() -> str | None:
    """The plugin platform's qualname on a ROCm GPU, else None (never raises)."""
    try:
        switch = envs.read(envs.SWITCH).value
        if switch is envs.Switch.OFF or not os.path.exists(KFD_DEVICE):
            return None
        decision = policy.decide_platform(switch, _rocm_gpu_present(), other_platform_plugins())
        global _platform_decision_logged
        with _lock:
            first, _platform_decision_logged = not _platform_decision_logged, True
        if first:
            _log(decision)
        return policy.PLATFORM_QUALNAME if decision.activate else None
    except Exception as exc:
        logger().warning(
            "vllm-rocm-aiter-plugin platform detection failed (%s: %s); vLLM's own platform "
            "detection applies.",
            type(exc).__name__,
            exc,
        )
        return None


def _rocm_gpu_present() -> bool:
    """vLLM's own ROCm probe (amdsmi), which does not import ``vllm.platforms.rocm``."""
    from vllm.platforms import rocm_platform_plugin

    return rocm_platform_plugin() is not None


def other_platform_plugins() -> list[str]:
    """Other out-of-tree platform plugins that vLLM would load (installed and allowed)."""
    from importlib.metadata import entry_points

    allowlist = envs.read(envs.VLLM_PLUGINS).value
    return sorted(
        ep.name
        for ep in entry_points(group="vllm.platform_plugins")
        if ep.name != envs.PLUGIN_NAME and policy.plugin_allowed(allowlist, ep.name)
    )


def _log(decision: policy.Decision) -> None:
    logger().log(logging.getLevelName(decision.level), "%s", decision.message)
