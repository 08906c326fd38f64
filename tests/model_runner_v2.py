"""Model-runner V2's own code paths, for tests: its batch order and its metadata builder call.

- ``v2_order``: the installed vLLM's ``sort_batch_req_ids`` (0.33.0 and others that have it); on
  releases without it, the key of 0.23.0's ``GPUModelRunner.prepare_inputs`` (query length alone,
  a stable sort).
- ``build_through_v2``: ``vllm.v1.worker.gpu.attn_utils.build_attn_metadata`` over a real
  ``AttentionGroup`` and ``KVCacheConfig``, the function model-runner V2 and its EAGLE speculator
  call, with only the keyword arguments the installed release accepts.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st
from vllm.v1.attention.backend import CommonAttentionMetadata

from vllm_rocm_aiter_plugin.diagnostics import samples


def _vllm_sort():
    from vllm.v1.worker.gpu import model_runner

    return getattr(model_runner, "sort_batch_req_ids", None)


def v2_order(
    num_tokens_per_req: Mapping[str, int],
    draft_tokens: Mapping[str, list[int]],
    decode_query_len: int,
) -> list[str]:
    """Request ids in the order model-runner V2 lays out a step."""
    sort = _vllm_sort()
    if sort is None:
        return sorted(num_tokens_per_req, key=num_tokens_per_req.get)  # 0.23.0 prepare_inputs
    # Its signature grows over releases (0.27.0: no draft_tokens): pass what it asks for.
    known = {
        "num_tokens_per_req": dict(num_tokens_per_req),
        "draft_tokens": dict(draft_tokens),
        "decode_query_len": decode_query_len,
    }
    params = list(inspect.signature(sort).parameters)
    unknown = [name for name in params if name not in known]
    assert not unknown, f"this vLLM's sort_batch_req_ids takes {params}: teach v2_order {unknown}"
    return sort(**{name: known[name] for name in params})


def has_vllm_sort() -> bool:
    return _vllm_sort() is not None


@dataclass(frozen=True)
class StepRequest:
    """One request of a scheduled step: cached tokens, tokens scheduled now, draft tokens."""

    req_id: str
    context_len: int
    query_len: int
    num_drafts: int = 0
    prompt_done: bool = True  # False for a chunked prefill still consuming its prompt


@dataclass(frozen=True)
class Step:
    threshold: int
    requests: tuple[StepRequest, ...]
    num_padded_reqs: int = 0  # zero-length requests MRV2 appends for CUDA-graph sizes
    upper_bound_slack: tuple[int, ...] = ()

    def v2_ordered(self) -> list[StepRequest]:
        by_id = {r.req_id: r for r in self.requests}
        order = v2_order(
            {r.req_id: r.query_len for r in self.requests},
            {r.req_id: [0] * r.num_drafts for r in self.requests if r.num_drafts},
            self.threshold,
        )
        return [by_id[i] for i in order]

    def v1_ordered(self) -> list[StepRequest]:
        """The regions of ``reorder_batch_to_split_decodes_and_prefills``: decode, short extend,
        long extend, prefill (its swaps do not keep order inside a region; any order is valid)."""

        def region(r: StepRequest) -> int:
            if not r.context_len:
                return 3
            if r.query_len > self.threshold:
                return 2
            return 0 if r.prompt_done else 1

        return sorted(self.requests, key=region)

    def lens(self, ordered: Sequence[StepRequest]) -> tuple[list[int], list[int]]:
        query = [r.query_len for r in ordered] + [0] * self.num_padded_reqs
        seq = [r.context_len + r.query_len for r in ordered] + [0] * self.num_padded_reqs
        return query, seq

    def batch(self, ordered: Sequence[StepRequest], **kwargs: Any) -> CommonAttentionMetadata:
        query, seq = self.lens(ordered)
        slack = [
            self.upper_bound_slack[i % len(self.upper_bound_slack)]
            if self.upper_bound_slack and i < len(ordered) and ordered[i].context_len
            else 0
            for i in range(len(query))
        ]
        return samples.make_batch(query, seq, upper_bound_slack=slack, **kwargs)


@st.composite
def v2_steps(
    draw: st.DrawFn,
    thresholds: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
    max_requests: int = 16,
    max_query: int = 96,
    max_context: int = 4096,
) -> Step:
    """A step as the scheduler hands it to model-runner V2: decodes (with draft tokens when the
    threshold says speculation is on), new prompts short and long, chunked-prefill continuations
    and prefix-cache hits with context, in submission order, optionally CUDA-graph padded."""
    threshold = draw(st.sampled_from(thresholds))
    num_drafts = threshold - 1
    context = st.integers(1, max_context)
    requests = []
    for i in range(draw(st.integers(1, max_requests))):
        kind = draw(
            st.sampled_from(["decode", "decode", "prompt", "prompt", "continuation", "cache-hit"])
        )
        if kind == "decode":
            accepted = draw(st.booleans()) or not num_drafts
            q = 1 + num_drafts if accepted else draw(st.integers(1, 1 + num_drafts))
            r = StepRequest(f"r{i}", draw(context), q, num_drafts if q > 1 else 0)
        elif kind == "prompt":
            r = StepRequest(f"r{i}", 0, draw(st.integers(1, max_query)), prompt_done=False)
        else:  # a later chunk of a long prompt, or a new prompt whose prefix was cached
            r = StepRequest(f"r{i}", draw(context), draw(st.integers(1, max_query)), 0, False)
        requests.append(r)
    slack = tuple(draw(st.lists(st.integers(0, num_drafts), min_size=1, max_size=4)))
    return Step(threshold, tuple(requests), draw(st.integers(0, 2)), slack)


def kv_cache_config(layer_name: str, spec: Any) -> Any:
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    return KVCacheConfig(
        num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec([layer_name], spec)]
    )


def attention_group(backend: type, vllm_config: Any, layer_name: str, spec: Any) -> Any:
    """vLLM's ``AttentionGroup`` for one layer, its metadata builder created by vLLM."""
    from vllm.v1.worker.utils import AttentionGroup

    group = AttentionGroup(
        backend=backend, layer_names=[layer_name], kv_cache_spec=spec, kv_cache_group_id=0
    )
    group.create_metadata_builders(vllm_config, torch.device("cpu"))
    return group


def build_through_v2(
    group: Any,
    cam: CommonAttentionMetadata,
    *,
    max_query_len: int | None = None,
    with_upper_bound: bool = True,
    num_reqs: int | None = None,
) -> Any:
    """The metadata ``build_attn_metadata`` gives ``group``'s layer for the batch ``cam``."""
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
        kv_cache_config=kv_cache_config(group.layer_names[0], group.kv_cache_spec),
    )
    upper_bound = getattr(cam, "seq_lens_cpu_upper_bound", None)
    if with_upper_bound and upper_bound is not None:
        kwargs["seq_lens_cpu_upper_bound"] = upper_bound
    accepted = inspect.signature(build_attn_metadata).parameters
    unknown = set(kwargs) - set(accepted)
    assert not unknown, f"this vLLM's build_attn_metadata does not take {sorted(unknown)}"
    return build_attn_metadata(**kwargs)[group.layer_names[0]]
