"""The ROCM_AITER_FA attention impl the plugin registers: vLLM's impl, with empty context chunks
kept empty on releases whose merge turns them into NaN, and a layer's attention sink counted once
in the extend path. Why, and when each can go: ``docs/deviations.md``, "impl: ..." entries.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.attention.backends.rocm_aiter_fa import (
    AiterFlashAttentionImpl,
    AiterFlashAttentionMetadata,
)

from vllm_rocm_aiter_plugin.log import logger
from vllm_rocm_aiter_plugin.rebind import loads_global, with_globals

MERGE_GLOBAL_NAME = "merge_attn_states"
OPS_GLOBAL_NAME = "rocm_aiter_ops"
GATHER_GLOBAL_NAME = "cp_mha_gather_cache"

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
        logger().info(
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


def sink_in_new_token_call_only(ops: type[Any]) -> type[Any]:
    """``ops`` (vLLM's ``rocm_aiter_ops``) whose ``flash_attn_varlen_func`` keeps ``sink_ptr``
    only on the call whose keys are the queries' own tokens (``cu_seqlens_k`` is
    ``cu_seqlens_q``): in ``extend_forward`` that is the new-token call, where every row has keys;
    the context-chunk calls run without it. On AITER's CK route the forward pipeline folds a sink
    into each call's softmax and lse (running max starts at the sink, the running sum at 1; a row
    with no keys gets lse = sink), so a merge of calls that all carry it counts it once per call;
    carried by one call whose rows all have keys, it is counted once. AITER's v3 assembly route
    takes no sink on any call (``docs/upstream/aiter.md``, finding 5)."""
    vllm_call = ops.flash_attn_varlen_func

    def flash_attn_varlen_func(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("cu_seqlens_k") is not kwargs.get("cu_seqlens_q"):
            kwargs["sink_ptr"] = None
        return vllm_call(*args, **kwargs)

    return type(f"SinkOnce{ops.__name__}", (ops,), {
        "flash_attn_varlen_func": staticmethod(flash_attn_varlen_func),
        "__doc__": sink_in_new_token_call_only.__doc__,
    })  # fmt: skip


class _SinkCallRecorder:
    """Stands in for ``rocm_aiter_ops`` in :func:`vllm_counts_sink_once`'s run of vLLM's code:
    records which ``flash_attn_varlen_func`` calls carry a sink, and computes nothing."""

    sink_calls: list[bool]

    @classmethod
    def flash_attn_varlen_func(cls, **kwargs: Any) -> Any:
        cls.sink_calls.append(kwargs.get("sink_ptr") is not None)
        query = kwargs["q"]
        lse = torch.zeros(query.shape[1], query.shape[0])
        return (torch.zeros_like(query), lse) if kwargs.get("return_lse") else None

    @staticmethod
    def is_shuffle_kv_cache_enabled() -> bool:
        return False


@functools.cache
def vllm_counts_sink_once(extend_forward: Callable[..., Any]) -> bool | None:
    """Whether vLLM's own ``extend_forward`` passes a layer's sink to one AITER call only (vLLM
    0.34.0: its context-chunk calls pass ``sink_ptr=None``), found by running that code on a
    two-chunk extend region of one tiny request with ``rocm_aiter_ops`` recording the calls
    (the gather and the merges do nothing). None where vLLM's code could not be run that way:
    the plugin then passes the sink to the new-token call only, which is right either way."""
    from types import SimpleNamespace

    recorder: type[_SinkCallRecorder] = type("Recorder", (_SinkCallRecorder,), {"sink_calls": []})

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    query = torch.zeros(2, 1, 8)
    lens = torch.tensor([0, 1], dtype=torch.int32)
    chunks = SimpleNamespace(
        num_chunks=2, workspace=torch.zeros(2, 2, 1, 8), cu_seq_lens_chunk=[lens, lens],
        max_seq_lens=[1, 1], chunk_starts=[lens[:1], lens[1:]], token_to_batch=[lens, lens],
        total_token_per_batch=[1, 1], seq_tot=[1, 1],
    )  # fmt: skip
    known = {
        "attn_metadata": SimpleNamespace(
            extend_metadata=SimpleNamespace(chunk_context_metadata=chunks)
        ),
        "query": query, "key": query, "value": query, "key_cache": query, "value_cache": query,
        "output": torch.zeros_like(query), "cu_seqlens_q": torch.tensor([0, 2]),
        "max_seqlen_q": 2, "min_seqlen_q": 1, "max_seqlen_k": 2, "block_table": lens[None],
        "slot_mapping": lens, "k_scale": torch.ones(()), "v_scale": torch.ones(()),
    }  # fmt: skip
    layer = SimpleNamespace(
        sinks=torch.zeros(1), sliding_window=(-1, -1), scale=1.0, alibi_slopes=None,
        kv_cache_dtype="auto", num_heads=1, num_kv_heads=1, head_size=8,
    )  # fmt: skip
    try:
        params = list(inspect.signature(extend_forward).parameters)[1:]
        run = with_globals(
            extend_forward,
            {OPS_GLOBAL_NAME: recorder, MERGE_GLOBAL_NAME: nothing, GATHER_GLOBAL_NAME: nothing},
        )
        run(layer, **{name: known[name] for name in params})
    except Exception:  # another release's code: not known, never a stopped start
        return None
    return recorder.sink_calls.count(True) == 1 and len(recorder.sink_calls) == 3


@functools.cache
def _rebound(
    extend_forward: Callable[..., Any], guard_merge: bool, sink_once: bool
) -> Callable[..., Any]:
    """vLLM's ``extend_forward`` code with its ``merge_attn_states`` global guarded and/or its
    ``rocm_aiter_ops`` global passing the sink to the new-token call only."""
    replacements: dict[str, Any] = {}
    if guard_merge:
        merge = extend_forward.__globals__[MERGE_GLOBAL_NAME]
        replacements[MERGE_GLOBAL_NAME] = keep_empty_states_empty(merge)
    if sink_once:
        if loads_global(extend_forward.__code__, OPS_GLOBAL_NAME):
            ops = extend_forward.__globals__[OPS_GLOBAL_NAME]
            replacements[OPS_GLOBAL_NAME] = sink_in_new_token_call_only(ops)
        else:  # a release whose extend path calls AITER otherwise: its own behaviour, said once
            logger().warning(
                "This vLLM's extend_forward does not call rocm_aiter_ops from its module globals; "
                "the plugin cannot count attention sinks once there and leaves vLLM's behaviour."
            )
    if not replacements:
        return extend_forward
    return with_globals(extend_forward, replacements)


class PluginAiterFlashAttentionImpl(AiterFlashAttentionImpl):
    """vLLM's ``AiterFlashAttentionImpl``; only ``extend_forward`` differs: when the context
    comes in two chunks or more and the release's merge makes NaN of two empty states, and when
    the layer has attention sinks and no sliding window (whose extend path is one call)."""

    def extend_forward(
        self, attn_metadata: AiterFlashAttentionMetadata, *args: Any, **kwargs: Any
    ) -> Any:
        vllm_extend_forward = super().extend_forward
        extend = attn_metadata.extend_metadata
        chunks = extend.chunk_context_metadata.num_chunks if extend is not None else 0
        function = vllm_extend_forward.__func__  # type: ignore[attr-defined]
        guard_merge = False
        if chunks > 1:
            query = kwargs["query"] if "query" in kwargs else args[0]
            merge = function.__globals__[MERGE_GLOBAL_NAME]
            guard_merge = merge_makes_nan_of_empty_states(
                merge, query.device, query.dtype, self.head_size
            )
        sinks = getattr(self, "sinks", None)  # releases before sink support have no attribute
        sink_once = (
            chunks > 0
            and sinks is not None
            and self.sliding_window[0] == -1
            and not vllm_counts_sink_once(function)  # 0.34.0 does it itself: steps aside
        )
        if guard_merge or sink_once:
            return _rebound(function, guard_merge, sink_once)(self, attn_metadata, *args, **kwargs)
        return vllm_extend_forward(attn_metadata, *args, **kwargs)
