"""The ROCM_AITER_FA attention impl the plugin registers: vLLM's impl, with empty context chunks
kept empty on releases whose merge turns them into NaN.

The plugin's split puts new prompts (no context) in the extend region when model-runner V2 sorts
them before a row with context. ``AiterFlashAttentionImpl.extend_forward`` merges the context
chunks one after the other with ``merge_attn_states``; for a row without context both sides of
each chunk-to-chunk merge are empty (lse = -inf). vLLM's Triton merge up to 0.25.1 computes
``exp(-inf - -inf)`` there: NaN. Where the installed release's merge does that (probed once per
device, dtype and head size, by running it on two empty states), the extend path runs vLLM's own
``extend_forward`` code with a merge that keeps both-empty rows empty (output 0, lse -inf);
everywhere else it is vLLM's ``extend_forward`` unchanged. Why, and when it can go:
``docs/deviations.md``, "impl: empty context chunks".

The extend path never runs under CUDA-graph capture (ROCM_AITER_FA captures uniform decode batches
only), so the one probe, a tiny merge and a host read, happens in eager mode.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionImpl,
    AiterFlashAttentionMetadata,
)

from vllm_rocm_aiter_plugin.policy import LOGGER_NAME
from vllm_rocm_aiter_plugin.rebind import with_globals

MERGE_GLOBAL_NAME = "merge_attn_states"

_probe_lock = threading.Lock()
_probed: dict[tuple[str, torch.dtype, int, Callable[..., Any]], bool] = {}


def merge_makes_nan_of_empty_states(
    merge: Callable[..., Any], device: torch.device, dtype: torch.dtype, head_size: int
) -> bool:
    """Run ``merge`` on one token, one head whose prefix and suffix are both empty (lse -inf):
    True if the merged output or lse is NaN. Cached per device, dtype, head size and merge."""
    key = (str(device), dtype, head_size, merge)
    with _probe_lock:
        if key in _probed:
            return _probed[key]
        empty_out = torch.zeros(1, 1, head_size, dtype=dtype, device=device)
        empty_lse = torch.full((1, 1), float("-inf"), dtype=torch.float32, device=device)
        output = torch.empty_like(empty_out)
        output_lse = torch.empty_like(empty_lse)
        merge(
            output=output,
            prefix_output=empty_out,
            prefix_lse=empty_lse,
            suffix_output=empty_out.clone(),
            suffix_lse=empty_lse.clone(),
            output_lse=output_lse,
        )
        nan = bool(output.isnan().any() or output_lse.isnan().any())
        _probed[key] = nan
    if nan:
        from vllm.logger import init_logger

        init_logger(LOGGER_NAME).info(
            "vLLM's merge_attn_states turns two empty attention states into NaN on this release "
            "(%s, %s); the plugin keeps context-free rows of the extend region finite.",
            device,
            dtype,
        )
    return nan


def keep_empty_states_empty(merge: Callable[..., Any]) -> Callable[..., Any]:
    """``merge`` followed by: where both prefix and suffix are empty (lse ±inf), output 0 and lse
    -inf, which is what the merge of two empty attention states is."""

    @functools.wraps(merge)
    def merge_with_empty_guard(
        output: torch.Tensor,
        prefix_output: torch.Tensor,
        prefix_lse: torch.Tensor,
        suffix_output: torch.Tensor,
        suffix_lse: torch.Tensor,
        output_lse: torch.Tensor | None = None,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        merge(
            output, prefix_output, prefix_lse, suffix_output, suffix_lse, output_lse,
            *args, **kwargs,
        )  # fmt: skip
        both_empty = torch.isinf(prefix_lse) & torch.isinf(suffix_lse)  # [heads, tokens]
        output.masked_fill_(both_empty.transpose(0, 1).unsqueeze(-1), 0.0)
        if output_lse is not None:
            output_lse.masked_fill_(both_empty, float("-inf"))

    return merge_with_empty_guard


@functools.cache
def _guarded(extend_forward: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``extend_forward`` code with its ``merge_attn_states`` global guarded."""
    merge = extend_forward.__globals__[MERGE_GLOBAL_NAME]
    return with_globals(extend_forward, {MERGE_GLOBAL_NAME: keep_empty_states_empty(merge)})


class PluginAiterFlashAttentionImpl(AiterFlashAttentionImpl):
    """vLLM's ``AiterFlashAttentionImpl``; only ``extend_forward`` differs, and only when the
    context comes in two chunks or more and the release's merge makes NaN of two empty states."""

    def extend_forward(
        self, attn_metadata: AiterFlashAttentionMetadata, *args: Any, **kwargs: Any
    ) -> Any:
        vllm_extend_forward = super().extend_forward
        extend = attn_metadata.extend_metadata
        if extend is not None and extend.chunk_context_metadata.num_chunks > 1:
            query = kwargs["query"] if "query" in kwargs else args[0]
            function = vllm_extend_forward.__func__  # type: ignore[attr-defined]
            merge = function.__globals__[MERGE_GLOBAL_NAME]
            if merge_makes_nan_of_empty_states(merge, query.device, query.dtype, self.head_size):
                return _guarded(function)(self, attn_metadata, *args, **kwargs)
        return vllm_extend_forward(attn_metadata, *args, **kwargs)
