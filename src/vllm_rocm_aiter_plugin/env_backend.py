"""``VLLM_ATTENTION_BACKEND`` for vLLM releases that no longer read it (0.18 onwards).

ROCm launch scripts and CI configs still set ``VLLM_ATTENTION_BACKEND``; vLLM 0.18-0.33 silently
ignore it. When the plugin's platform is active this maps the variable onto
``VllmConfig.attention_config.backend``, as ``--attention-backend`` would. It never stops a start
that works without the plugin: a legacy name maps to the V1 backend it meant where ROCm has one,
any other unknown name gives one WARNING naming the valid ones and leaves automatic selection, and
a backend the ROCm platform cannot run (:func:`why_rocm_cannot_run`), or one vLLM then rejects for
the model, falls back to automatic selection with a WARNING (:func:`select_attention_backend`).
Plain functions, tested on CPU; the platform class only calls them. Why: ``docs/deviations.md``,
"platform: VLLM_ATTENTION_BACKEND".
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

from vllm_rocm_aiter_plugin.envs import ATTENTION_BACKEND as ENV_VAR
from vllm_rocm_aiter_plugin.envs import Reading, parse_attention_backend
from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

LEGACY_NAMES: dict[str, str | None] = {
    # V0 and early-V1 names -> the V1 backend they meant on ROCm (None: no ROCm equivalent)
    "ROCM_FLASH": "ROCM_ATTN",  # V0's ROCm flash attention; its V1 successor
    "ROCM_ATTN_VLLM_V1": "ROCM_ATTN",
    "TRITON_ATTN_VLLM_V1": "TRITON_ATTN",
    "ROCM_AITER_FA_VLLM_V1": "ROCM_AITER_FA",
    "FLASH_ATTN_VLLM_V1": None,  # CUDA's FlashAttention: not a ROCm backend
    "XFORMERS": None,  # removed with V0
    "TORCH_SDPA_VLLM_V1": None,
}

logger = init_logger(LOGGER_NAME)


def resolve(raw: str | None) -> Reading:
    """What ``VLLM_ATTENTION_BACKEND=raw`` selects: an ``AttentionBackendEnum`` member, or None for
    automatic selection (unset, ``auto``, or a name that cannot be honoured, with a problem)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    named = parse_attention_backend(raw)
    if named.value is None:  # unset or auto
        return named
    name = named.value
    if name in AttentionBackendEnum.__members__:
        return Reading(
            AttentionBackendEnum[name],
            f"selects {name} when the plugin's platform is active (a ROCm GPU); vLLM itself "
            "ignores the variable",
        )
    if name in LEGACY_NAMES:
        target = LEGACY_NAMES[name]
        if target is not None and target in AttentionBackendEnum.__members__:
            return Reading(
                AttentionBackendEnum[target],
                f"legacy name for {target}: selects {target} when the plugin's platform is active",
            )
        return Reading(
            None,
            "legacy name with no ROCm backend: automatic selection",
            f"{ENV_VAR}={raw!r} names a backend vLLM no longer has on ROCm; automatic selection "
            f"applies. Valid names: {_valid_names()} (or auto).",
        )
    return Reading(
        None,
        "unknown name: automatic selection",
        f"{ENV_VAR}={raw!r} is not an attention backend this vLLM knows; automatic selection "
        f"applies. Valid names: {_valid_names()} (or auto).",
    )


def _valid_names() -> str:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return ", ".join(AttentionBackendEnum.__members__)


def apply_env_attention_backend(
    vllm_config: VllmConfig, environ: Mapping[str, str] | None = None
) -> AttentionBackendEnum | None:
    """Select ``VLLM_ATTENTION_BACKEND`` on ``vllm_config`` unless ``--attention-backend`` was given.

    Returns the backend the variable selected (None: it selected nothing). Never raises for the
    variable's value: a name it cannot honour gives one WARNING. When both are set and disagree,
    the command-line value wins and a WARNING says so.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_VAR)
    if raw is None:
        return None
    reading = resolve(raw)
    if reading.problem:
        logger.warning("%s", reading.problem)
    requested = reading.value
    attention_config = vllm_config.attention_config
    configured = attention_config.backend
    if requested is None or configured == requested:
        return None
    if configured is not None:
        logger.warning(
            "%s=%s is ignored: --attention-backend %s was also given and wins. Unset one of them.",
            ENV_VAR,
            raw,
            configured.name,
        )
        return None
    attention_config.backend = requested
    logger.info("Attention backend %s selected by %s=%s.", requested.name, ENV_VAR, raw)
    return requested


def select_attention_backend(
    select: Callable[..., str],
    selected_backend: Any,
    env_selected: Any,
    *args: Any,
    why_not_here: Callable[[Any], str | None] | None = None,
    **kwargs: Any,
) -> str:
    """``select(selected_backend, *args, **kwargs)`` (vLLM's ``get_attn_backend_cls``). When the
    backend came from ``VLLM_ATTENTION_BACKEND``, two checks come first and either gives a
    WARNING and automatic selection: ``why_not_here(backend)`` says why the platform cannot run
    it (None: it can), and vLLM rejecting it for this model (ValueError). Without the plugin the
    variable would have been ignored and vLLM would have started."""
    from_env = env_selected is not None and selected_backend is env_selected
    if from_env and why_not_here is not None:
        reason = why_not_here(env_selected)
        if reason:
            logger.warning(
                "%s=%s cannot run here (%s); automatic selection applies. Unset it, or name a "
                "backend this platform runs.",
                ENV_VAR,
                env_selected.name,
                reason,
            )
            return select(None, *args, **kwargs)
    try:
        return select(selected_backend, *args, **kwargs)
    except ValueError as exc:
        if not from_env:
            raise
        logger.warning(
            "%s=%s is not valid for this model on this GPU (%s); automatic selection applies.",
            ENV_VAR,
            env_selected.name,
            exc,
        )
        return select(None, *args, **kwargs)


def why_rocm_cannot_run(
    platform: Any, select: Callable[..., str], backend: Any, *args: Any, **kwargs: Any
) -> str | None:
    """Why vLLM's ROCm ``platform`` cannot run ``backend`` for the model that ``select``'s
    arguments describe (``args``, ``kwargs``: those of ``get_attn_backend_cls``); None when it can.

    It can run vLLM's ROCm backends (``ROCM_*``; vLLM validates them for the model next), and
    every backend that vLLM's own automatic selection on this platform finds valid for the model
    (``get_valid_backends``). Anything else, ``FLASH_ATTN`` (it needs the upstream flash-attn
    package on ROCm) or ``CPU_ATTN`` say, is refused: vLLM's ROCm selector would accept either
    and fail later. Where this vLLM cannot say which backends are valid, only ``ROCM_*`` runs."""
    if backend.name.startswith("ROCM_"):
        return None
    valid = _automatic_candidates(platform, select, backend, *args, **kwargs)
    if valid is None:
        return "this vLLM's ROCm platform does not say which backends it can run"
    if backend in valid:
        return None
    names = ", ".join(b.name for b in valid) or "none"
    return f"vLLM's ROCm platform does not run it for this model; it runs {names}"


def _automatic_candidates(
    platform: Any, select: Callable[..., str], backend: Any, *args: Any, **kwargs: Any
) -> list[Any] | None:
    """The backends ``platform.get_valid_backends`` finds valid for ``select``'s arguments, or
    None where this vLLM has no such method or its arguments do not match."""
    valid_backends = getattr(platform, "get_valid_backends", None)
    if valid_backends is None:
        return None
    try:
        given = inspect.signature(select).bind(backend, *args, **kwargs).arguments
        call = {}
        for name, parameter in inspect.signature(valid_backends).parameters.items():
            if name == "device_capability":
                call[name] = platform.get_device_capability()
            elif name in given:
                call[name] = given[name]
            elif parameter.default is inspect.Parameter.empty:
                return None
        valid, _invalid = valid_backends(**call)
    except Exception:  # vLLM's candidates failed to load here: this cannot say which can run
        return None
    return [candidate for candidate, _priority in valid]
