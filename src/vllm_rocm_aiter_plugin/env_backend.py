"""``VLLM_ATTENTION_BACKEND`` for vLLM releases that no longer read it (0.18 onwards).

The variable picks among the backends stock's own selection accepts for the layer at hand, plus
``ROCM_AITER_FA`` where AITER is supported; why: ``docs/deviations.md``, "platform: ...".
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vllm_rocm_aiter_plugin.envs import ATTENTION_BACKEND as ENV_VAR
from vllm_rocm_aiter_plugin.envs import Reading, parse_attention_backend, shown
from vllm_rocm_aiter_plugin.log import logger

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
    logger().log(level, "%s", text)


@dataclass(frozen=True)
class Offer:
    """What stock's automatic selection accepts for one layer: the valid candidates in vLLM's
    order, vLLM's reasons for the candidates it rejected, and whether AITER is found and
    supported (which adds ``ROCM_AITER_FA``)."""

    valid: tuple[Any, ...]
    invalid: Mapping[Any, tuple[str, ...]]
    aiter_supported: bool


def stock_offer(
    platform: Any, select: Callable[..., str], *args: Any, **kwargs: Any
) -> Offer | None:
    """What vLLM's ROCm ``platform`` would choose from for the layer that ``select``'s arguments
    describe (``args``, ``kwargs``: those of ``get_attn_backend_cls`` after the backend), asked of
    ``platform.get_valid_backends`` with exactly those arguments; None where this vLLM has no such
    method, its arguments do not match, or it fails (then nothing can be said to be offered)."""
    valid_backends = getattr(platform, "get_valid_backends", None)
    if valid_backends is None:
        return None
    try:
        given = inspect.signature(select).bind(None, *args, **kwargs).arguments
        call = {}
        for name, parameter in inspect.signature(valid_backends).parameters.items():
            if name == "device_capability":
                call[name] = platform.get_device_capability()
            elif name in given:
                call[name] = given[name]
            elif parameter.default is inspect.Parameter.empty:
                return None
        valid, invalid = valid_backends(**call)
    except Exception:  # vLLM's candidates failed to load here: nothing is known to be offered
        return None
    return Offer(
        tuple(backend for backend, _priority in sorted(valid, key=lambda pair: pair[1])),
        {backend: tuple(map(str, reasons)) for backend, reasons in invalid.items()},
        _aiter_found_and_supported(),
    )


def _aiter_found_and_supported() -> bool:
    """vLLM's own answer (``vllm._aiter_ops.is_aiter_found_and_supported``); False where this
    vLLM lacks it or it fails."""
    try:
        from vllm._aiter_ops import is_aiter_found_and_supported

        return bool(is_aiter_found_and_supported())
    except Exception:
        return False


def why_not_offered(backend: Any, offer: Offer | None) -> str | None:
    """Why the variable may not pick ``backend`` for a layer stock offers ``offer``; None when it
    may (vLLM's explicit selection still validates it next)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if offer is None:
        return "this vLLM's ROCm platform does not say which backends it selects automatically"
    if backend in offer.valid:
        return None
    if backend in offer.invalid:
        return f"vLLM's automatic selection rejects it for this layer ({'; '.join(offer.invalid[backend])})"
    offered = f"stock offers this layer {', '.join(b.name for b in offer.valid) or 'nothing'}"
    no_aiter = (
        "AITER is not found, or not supported on this GPU (vLLM's is_aiter_found_and_supported)"
    )
    if backend is AttentionBackendEnum.ROCM_AITER_FA:
        return None if offer.aiter_supported else f"{no_aiter}; {offered}"
    if "AITER" in backend.name and not offer.aiter_supported:
        return f"{no_aiter}, so stock's automatic selection does not offer it; {offered}"
    return f"stock's automatic selection does not offer it for this layer; {offered}"


@dataclass(frozen=True)
class Choice:
    """What one layer's selection gave: vLLM's path, the backend's name, and why the variable's
    backend was not honoured (None when it was)."""

    path: str
    name: str
    refused: str | None


def choose(
    select: Callable[..., str],
    requested: Any,
    offer: Callable[[], Offer | None],
    *args: Any,
    **kwargs: Any,
) -> Choice:
    """The selection for ``requested`` (the variable's backend) where vLLM passes none: vLLM's
    explicit selection of it where stock offers it, else (or where that raises) stock's automatic
    selection. Raises only what stock's automatic selection raises."""
    reason = why_not_offered(requested, offer())
    if reason is None:
        try:
            path = select(requested, *args, **kwargs)
        except Exception as exc:  # ValueError, or a backend that fails to validate: never a stop
            reason = f"vLLM rejects it for this layer ({type(exc).__name__}: {exc})"
        else:
            name = backend_name(path)
            if name != requested.name:  # vLLM's own per-layer rule replaced it (TurboQuant)
                reason = (
                    f"vLLM gave this layer {name} instead, by its own rule for this configuration"
                )
            return Choice(path, name, reason)
    path = select(None, *args, **kwargs)
    return Choice(path, backend_name(path), reason)


def backend_name(path: str) -> str:
    """The ``AttentionBackendEnum`` name whose class path (overrides included) is ``path``, else
    the path itself."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for member in AttentionBackendEnum:
        try:
            if member.get_path() == path:
                return member.name
        except Exception:  # a member without a class path (a placeholder)
            continue
    return path


def describe_layer(*args: Any, **kwargs: Any) -> str:
    """A short description of the layer ``get_attn_backend_cls``'s arguments after the backend
    describe, for log lines (its ``AttentionSelectorConfig``)."""
    selector = kwargs.get("attn_selector_config", args[0] if args else None)
    if selector is None or not hasattr(selector, "_asdict"):
        return "this layer"
    fields = selector._asdict()
    attn_type = fields.get("attn_type", "decoder")
    kind = str(getattr(attn_type, "value", attn_type))
    if fields.get("use_sparse"):
        kind = f"sparse MLA {kind}"
    elif fields.get("use_mla"):
        kind = f"MLA {kind}"
    dtype = str(fields.get("dtype")).removeprefix("torch.")
    return (
        f"{kind} layers (head size {fields.get('head_size')}, {dtype}, KV cache "
        f"{fields.get('kv_cache_dtype') or 'auto'})"
    )


def select_attention_backend(
    select: Callable[..., str],
    selected_backend: Any,
    *args: Any,
    offer: Callable[[], Offer | None] | None = None,
    environ: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """``select(selected_backend, *args, **kwargs)`` (vLLM's ``get_attn_backend_cls``), picking
    ``VLLM_ATTENTION_BACKEND``'s backend where vLLM passes none and stock's automatic selection
    accepts it for this layer (``offer``: :func:`stock_offer` for these arguments; None offers
    nothing).
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
                "--attention-backend, the speculative config, or vLLM's own choice for this "
                "model), which wins.",
                ENV_VAR,
                requested.name,
                selected_backend.name,
            )
        return select(selected_backend, *args, **kwargs)
    choice = choose(select, requested, offer or (lambda: None), *args, **kwargs)
    layer = describe_layer(*args, **kwargs)
    if choice.refused:
        _once(
            logging.WARNING,
            "%s=%s is not honoured for %s: %s. Stock's automatic selection applies: %s.",
            ENV_VAR,
            requested.name,
            layer,
            choice.refused,
            choice.name,
        )
    else:
        _once(
            logging.INFO,
            "Attention backend %s selected by %s=%s for %s (vLLM's next line says "
            "--attention-backend; no config field is changed).",
            choice.name,
            ENV_VAR,
            shown(raw),
            layer,
        )
    return choice.path
