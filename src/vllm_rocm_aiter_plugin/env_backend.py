"""``VLLM_ATTENTION_BACKEND`` for vLLM releases that no longer read it (0.18 onwards).

ROCm launch scripts and CI configs still set ``VLLM_ATTENTION_BACKEND``; vLLM 0.18-0.33 silently
ignore it. When the plugin's platform is active the variable names the backend that vLLM's
backend selection (``get_attn_backend_cls``) tries where vLLM itself passes none, and reaches
nothing else: no ``VllmConfig`` field is written, so model code, config hooks and usage stats that
read ``attention_config.backend`` see what they see without the plugin. It never stops a start
that works without the plugin: a legacy name maps to the V1 backend it meant where ROCm has one,
any other unknown name gives one WARNING naming the valid ones and leaves automatic selection, and
a backend the ROCm platform cannot run (:func:`why_rocm_cannot_run`), or one vLLM then rejects for
the model, falls back to automatic selection with a WARNING (:func:`select_attention_backend`).
Plain functions, tested on CPU; the platform class only calls them. Why: ``docs/deviations.md``,
"platform: VLLM_ATTENTION_BACKEND".
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from vllm.logger import init_logger

from vllm_rocm_aiter_plugin.envs import ATTENTION_BACKEND as ENV_VAR
from vllm_rocm_aiter_plugin.envs import Reading, parse_attention_backend, shown
from vllm_rocm_aiter_plugin.policy import LOGGER_NAME

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
    if raw is None or named.value is None:  # unset or auto
        return named
    name = named.value
    if name in AttentionBackendEnum.__members__:
        return Reading(
            AttentionBackendEnum[name],
            f"selects {name} where vLLM selects automatically, when the plugin's platform is "
            "active (a ROCm GPU); vLLM itself ignores the variable",
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
            f"{ENV_VAR}={shown(raw)} names a backend vLLM no longer has on ROCm; automatic selection "
            f"applies. Valid names: {_valid_names()} (or auto).",
        )
    return Reading(
        None,
        "unknown name: automatic selection",
        f"{ENV_VAR}={shown(raw)} is not an attention backend this vLLM knows; automatic selection "
        f"applies. Valid names: {_valid_names()} (or auto).",
    )


def _valid_names() -> str:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return ", ".join(AttentionBackendEnum.__members__)


_said: set[str] = set()
_said_lock = threading.Lock()


def _once(level: int, message: str, *args: object) -> None:
    """Log a selection line once per process (vLLM selects once per kind of attention layer)."""
    text = message % args
    with _said_lock:
        if text in _said:
            return
        _said.add(text)
    logger.log(level, "%s", text)


def select_attention_backend(
    select: Callable[..., str],
    selected_backend: Any,
    *args: Any,
    why_not_here: Callable[[Any], str | None] | None = None,
    environ: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """``select(selected_backend, *args, **kwargs)`` (vLLM's ``get_attn_backend_cls``), trying
    ``VLLM_ATTENTION_BACKEND``'s backend where vLLM passes none.

    The variable reaches this call and nothing else: no field of ``VllmConfig`` is written, so
    every other reader of ``attention_config.backend`` sees what it sees without the plugin.
    Where vLLM passes a backend (``--attention-backend``, or one vLLM chose for the model) that
    backend is selected exactly as stock selects it, vLLM's errors included, and a variable that
    names another gives one WARNING. The variable's own backend falls back to automatic selection,
    with a WARNING, where ``why_not_here(backend)`` says the platform cannot run it or vLLM
    rejects it for this model (ValueError): stock would have ignored the variable and started.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_VAR)
    if raw is None:
        return select(selected_backend, *args, **kwargs)
    reading = resolve(raw)
    if reading.problem:
        _once(logging.WARNING, "%s", reading.problem)
    requested = reading.value
    if requested is None:
        return select(selected_backend, *args, **kwargs)
    if selected_backend is not None:
        if selected_backend != requested:
            _once(
                logging.WARNING,
                "%s=%s is ignored for this selection: vLLM already selects %s (from "
                "--attention-backend, or vLLM's own choice for this model), which wins.",
                ENV_VAR,
                requested.name,
                selected_backend.name,
            )
        return select(selected_backend, *args, **kwargs)
    reason = why_not_here(requested) if why_not_here is not None else None
    if reason:
        _once(
            logging.WARNING,
            "%s=%s cannot run here (%s); automatic selection applies. Unset it, or name a "
            "backend this platform runs.",
            ENV_VAR,
            requested.name,
            reason,
        )
        return select(None, *args, **kwargs)
    try:
        path = select(requested, *args, **kwargs)
    except ValueError as exc:
        _once(
            logging.WARNING,
            "%s=%s is not valid for this model on this GPU (%s); automatic selection applies.",
            ENV_VAR,
            requested.name,
            exc,
        )
        return select(None, *args, **kwargs)
    _once(
        logging.INFO,
        "Attention backend %s selected by %s=%s (vLLM's next line says --attention-backend; "
        "no config field is changed).",
        requested.name,
        ENV_VAR,
        shown(raw),
    )
    return path


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
