"""Defects planted in the forward tier's stand-ins, each of which the tier must catch: its tests
run each one (``tests/helpers/forward_child.py``, after the unmutated run) and expect failures.
They change the plugin's own stand-ins (never vLLM); what ships never plants them."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from vllm_rocm_aiter_plugin import split
from vllm_rocm_aiter_plugin.diagnostics.forward import reference_kernels

MUTATIONS = {
    "reference-drops-kv-scales": "the unified_attention reference ignores k_descale/v_descale",
    "widened-fp8-caches": "AITER's kernel is handed fp8 caches widened to float32, so it skips "
    "its descale",
    "reference-drops-sink-on-causal-calls": "flash_attn_varlen_func's reference ignores sink_ptr "
    "on causal calls, as a CK that sets the sink to -inf under a mask without AITER's "
    "compensation would",
    "exposure-misses-a-row": "the exposure count leaves out one of the rows stock serves "
    "without their context",
}
OF_THE_REFERENCE = frozenset({"reference-drops-kv-scales"})
"""Mutations of the torch reference of ``unified_attention``: run with that reference as the
kernel (elsewhere AITER's own kernel runs, where its wheel loads)."""


def _reference_without_kv_scales(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kwargs: Any
) -> None:
    """The ``unified_attention`` reference handed descales of 1: one that drops the scales."""
    ones = {
        name: torch.ones_like(kwargs[name])
        for name in ("k_descale", "v_descale")
        if kwargs.get(name) is not None
    }
    reference_kernels.unified_attention(q, k, v, out, **{**kwargs, **ones})


_VARLEN = reference_kernels.flash_attn_varlen_func
_VARLEN_SIGNATURE = inspect.signature(_VARLEN)


def _varlen_dropping_sink_on_causal_calls(*args: Any, **kwargs: Any) -> Any:
    call = _VARLEN_SIGNATURE.bind(*args, **kwargs)
    if call.arguments.get("causal"):
        call.arguments["sink_ptr"] = None
    return _VARLEN(*call.args, **call.kwargs)


_EXPOSURE = split._stock_exposure


def _missing_a_row(*args: Any) -> tuple[int, int]:
    requests, tokens = _EXPOSURE(*args)
    return max(requests - 1, 0), tokens


@contextlib.contextmanager
def planted(name: str, unified_attention: Any) -> Iterator[None]:
    """Within the block, the forward runner's stand-ins carry the defect ``name``;
    ``unified_attention`` is what the block's runner runs as AITER's kernel."""
    if name not in MUTATIONS:
        raise ValueError(f"unknown mutation {name!r}; known: {sorted(MUTATIONS)}")
    if unified_attention is None or reference_kernels.aiter_available():
        raise RuntimeError("no mutation applies where AITER's real kernels run (ROCm)")
    if name == "reference-drops-kv-scales":
        unified_attention.reference = _reference_without_kv_scales
        if not unified_attention.is_aiter:
            unified_attention.function = _reference_without_kv_scales
    if name == "widened-fp8-caches":
        unified_attention.widen_fp8_caches = True
    with contextlib.ExitStack() as stack:
        if name == "exposure-misses-a-row":
            stack.enter_context(mock.patch.object(split, "_stock_exposure", _missing_a_row))
        if name == "reference-drops-sink-on-causal-calls":
            stack.enter_context(mock.patch.object(
                reference_kernels, "flash_attn_varlen_func", _varlen_dropping_sink_on_causal_calls
            ))  # fmt: skip
        yield
