"""Defects planted in the forward tier's stand-ins, each of which the tier must catch: its tests
(``tests/test_forward_fp8.py``, ``tests/test_sinks.py``) run each one and expect failures. Only
the tests' child (:mod:`tests.helpers.forward_child`) plants them; what ships never does."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any
from unittest import mock

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import aiter_triton, reference_kernels, runner

MUTATIONS = {
    "reference-drops-kv-scales": "the unified_attention reference ignores k_descale/v_descale",
    "widened-fp8-caches": "AITER's kernel is handed fp8 caches widened to float32, so it skips "
    "its descale",
    "reference-drops-sink-on-causal-calls": "flash_attn_varlen_func's reference ignores sink_ptr "
    "on causal calls, as a CK that sets the sink to -inf under a mask without AITER's "
    "compensation would",
}


def _reference_without_kv_scales(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, **kwargs: Any
) -> None:
    """The ``unified_attention`` reference handed descales of 1: a reference that drops the
    cache's scales."""
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


def _mutated_unified_attention(names: Sequence[str]) -> Any:
    unmutated = runner.unified_attention_for

    def unified_attention_for(device: torch.device) -> aiter_triton.UnifiedAttention:
        kernel = unmutated(device)
        if kernel is None:
            raise RuntimeError("no mutation applies where AITER's real kernels run (ROCm)")
        if "reference-drops-kv-scales" in names:
            kernel.reference = _reference_without_kv_scales
            if not kernel.is_aiter:
                kernel.function = _reference_without_kv_scales
        if "widened-fp8-caches" in names:
            kernel.widen_fp8_caches = True
        return kernel

    return unified_attention_for


@contextlib.contextmanager
def planted(names: Sequence[str]) -> Iterator[None]:
    """Within the block, the forward runner's stand-ins carry the defects ``names``."""
    unknown = sorted(set(names) - set(MUTATIONS))
    if unknown:
        raise ValueError(f"unknown mutations {unknown}; known: {sorted(MUTATIONS)}")
    with contextlib.ExitStack() as stack:
        if {"reference-drops-kv-scales", "widened-fp8-caches"} & set(names):
            stack.enter_context(
                mock.patch.object(
                    runner, "unified_attention_for", _mutated_unified_attention(names)
                )
            )
        if "reference-drops-sink-on-causal-calls" in names:
            if reference_kernels.aiter_available():
                raise RuntimeError("no mutation applies where AITER's real kernels run (ROCm)")
            stack.enter_context(
                mock.patch.object(
                    reference_kernels,
                    "flash_attn_varlen_func",
                    _varlen_dropping_sink_on_causal_calls,
                )
            )
        yield
