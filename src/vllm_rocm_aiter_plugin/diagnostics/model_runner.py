"""vLLM's own code paths for laying out a step and building its attention metadata."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata


def _vllm_sort() -> Any:
    from vllm.v1.worker.gpu import model_runner

    return getattr(model_runner, "sort_batch_req_ids", None)


def v2_order(
    num_tokens_per_req: Mapping[str, int],
    draft_tokens: Mapping[str, Sequence[int]],
    decode_query_len: int,
) -> list[str]:
    """Request ids in the order model-runner V2 lays out a step."""
    sort = _vllm_sort()
    if sort is None:
        return sorted(num_tokens_per_req, key=num_tokens_per_req.__getitem__)
    known = {
        "num_tokens_per_req": dict(num_tokens_per_req),
        "draft_tokens": {r: list(t) for r, t in draft_tokens.items()},
        "decode_query_len": decode_query_len,
    }
    params = list(inspect.signature(sort).parameters)
    unknown = [name for name in params if name not in known]
    if unknown:
        raise TypeError(f"this vLLM's sort_batch_req_ids takes {params}; not known: {unknown}")
    return sort(**{name: known[name] for name in params})


def v2_order_source() -> str:
    return (
        "vLLM's sort_batch_req_ids"
        if _vllm_sort() is not None
        else "query length (GPUModelRunner.prepare_inputs)"
    )


class RequestTable:
    """The part of vLLM's ``InputBatch`` that ``reorder_batch_to_split_decodes_and_prefills``
    reads and changes: request ids, computed and prompt token counts, and ``swap_states``."""

    def __init__(self, req_ids: Sequence[str], computed: Sequence[int], prompt: Sequence[int]):
        self.req_ids = list(req_ids)
        self.num_computed_tokens_cpu = np.array(computed, dtype=np.int32)
        self.num_prompt_tokens = np.array(prompt, dtype=np.int32)

    def swap_states(self, i: int, j: int) -> None:
        self.req_ids[i], self.req_ids[j] = self.req_ids[j], self.req_ids[i]
        for array in (self.num_computed_tokens_cpu, self.num_prompt_tokens):
            array[[i, j]] = array[[j, i]]


@dataclass(frozen=True)
class ScheduledTokens:
    """The one field of vLLM's ``SchedulerOutput`` that the V1 reorder reads."""

    num_scheduled_tokens: Mapping[str, int]


V1_REORDER_NAME = "reorder_batch_to_split_decodes_and_prefills"


def _v1_reorder() -> Any:
    from vllm.v1.attention.backends import utils

    return getattr(utils, V1_REORDER_NAME, None)


def why_no_v1_order() -> str | None:
    """Why V1-order steps do not apply to the installed vLLM (no V1 model runner), or None."""
    if _v1_reorder() is not None:
        return None
    return (
        f"this vLLM has no V1 model runner (vllm.v1.attention.backends.utils has no "
        f"{V1_REORDER_NAME}; vLLM 0.34.0 removed both): model-runner V2 lays out every step, so "
        "V1-order steps do not occur"
    )


def v1_order(
    num_tokens_per_req: Mapping[str, int],
    computed: Mapping[str, int],
    prompt_lens: Mapping[str, int],
    decode_threshold: int,
    scheduler_output: Any = None,
) -> list[str]:
    """Request ids in the order the V1 runner gives them after vLLM's reorder (starting from the
    scheduler's order, as the runner's persistent batch does for new requests)."""
    reorder = _v1_reorder()
    if reorder is None:
        raise LookupError(why_no_v1_order())
    req_ids = list(num_tokens_per_req)
    table = RequestTable(req_ids, [computed[r] for r in req_ids], [prompt_lens[r] for r in req_ids])
    output = scheduler_output or ScheduledTokens(num_tokens_per_req)
    # The table and the scheduler output hold exactly what the reorder reads (see the classes).
    reorder(table, output, decode_threshold)
    return table.req_ids


def builds_non_causal_batches() -> bool:
    """Whether this release's model-runner V2 can build a non-causal batch (0.33)."""
    from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

    return "causal" in inspect.signature(build_attn_metadata).parameters


def kv_cache_config(layer_names: Sequence[str], spec: Any, num_blocks: int = 1) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(list(layer_names), spec)],
    )


def attention_group(
    backend: type, vllm_config: Any, layer_name: str, spec: Any, device: torch.device | str = "cpu"
) -> Any:
    """vLLM's ``AttentionGroup`` for one layer, its metadata builder created by vLLM."""
    from vllm.v1.worker.utils import AttentionGroup

    group = AttentionGroup(
        backend=backend, layer_names=[layer_name], kv_cache_spec=spec, kv_cache_group_id=0
    )
    group.create_metadata_builders(vllm_config, torch.device(device))
    return group


def build_through_v2(
    group: Any,
    cam: CommonAttentionMetadata,
    *,
    max_query_len: int | None = None,
    with_upper_bound: bool = True,
    num_reqs: int | None = None,
    for_cudagraph_capture: bool = False,
) -> Any:
    """The metadata ``build_attn_metadata`` gives ``group``'s layer for the batch ``cam`` (as
    for a CUDA-graph capture where ``for_cudagraph_capture``: a release whose function does not
    take it captures with its ordinary build)."""
    from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

    kwargs: dict[str, Any] = dict(
        attn_groups=[[group]],
        num_reqs=cam.num_reqs if num_reqs is None else num_reqs,
        num_tokens=cam.num_actual_tokens,
        query_start_loc_gpu=cam.query_start_loc,
        query_start_loc_cpu=cam.query_start_loc_cpu,
        max_query_len=cam.max_query_len if max_query_len is None else max_query_len,
        seq_lens=cam.seq_lens,
        max_seq_len=cam.max_seq_len,
        block_tables=[cam.block_table_tensor],
        slot_mappings=cam.slot_mapping[None],
        kv_cache_config=kv_cache_config(group.layer_names, group.kv_cache_spec),
    )
    upper_bound = getattr(cam, "seq_lens_cpu_upper_bound", None)
    if with_upper_bound and upper_bound is not None:
        kwargs["seq_lens_cpu_upper_bound"] = upper_bound
    if not getattr(cam, "causal", True):
        kwargs["causal"] = False  # 0.33's runner builds non-causal batches this way
    accepted = inspect.signature(build_attn_metadata).parameters
    if for_cudagraph_capture and "for_cudagraph_capture" in accepted:
        kwargs["for_cudagraph_capture"] = True
    unknown = set(kwargs) - set(accepted)
    if unknown:
        raise TypeError(f"this vLLM's build_attn_metadata does not take {sorted(unknown)}")
    return build_attn_metadata(**kwargs)[group.layer_names[0]]
