"""``VLLM_ATTENTION_BACKEND`` for vLLM releases that no longer read it (0.18 onwards).

ROCm launch scripts and CI configs still set ``VLLM_ATTENTION_BACKEND``; vLLM 0.18-0.33 silently
ignore it. When the plugin's platform is active this maps the variable onto
``VllmConfig.attention_config.backend``, as ``--attention-backend`` would. It never stops a start
that works without the plugin: a legacy name maps to the V1 backend it meant where ROCm has one,
any other unknown name gives one WARNING naming the valid ones and leaves automatic selection, and
a backend vLLM then rejects for the model falls back to automatic selection with a WARNING
(:func:`select_attention_backend`). Plain functions, tested on CPU; the platform class only calls
them. Why: ``docs/deviations.md``, "platform: VLLM_ATTENTION_BACKEND".
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from vllm.logger import init_logger

from vllm_rocm_aiter_plugin.envs import ATTENTION_BACKEND as ENV_VAR
from vllm_rocm_aiter_plugin.envs import Reading
from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

_AUTO = {"", "auto"}

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

    if raw is None:
        return Reading(None, "unset: automatic selection")
    name = raw.strip().upper()
    if name.lower() in _AUTO:
        return Reading(None, "auto: automatic selection")
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
    **kwargs: Any,
) -> str:
    """``select(selected_backend, *args, **kwargs)`` (vLLM's ``get_attn_backend_cls``); when the
    backend came from ``VLLM_ATTENTION_BACKEND`` and vLLM rejects it for this model (ValueError),
    a WARNING and automatic selection instead: without the plugin the variable would have been
    ignored and vLLM would have started."""
    try:
        return select(selected_backend, *args, **kwargs)
    except ValueError as exc:
        if env_selected is None or selected_backend is not env_selected:
            raise
        logger.warning(
            "%s=%s is not valid for this model on this GPU (%s); automatic selection applies.",
            ENV_VAR,
            env_selected.name,
            exc,
        )
        return select(None, *args, **kwargs)
