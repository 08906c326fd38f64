"""vLLM's own Scheduler driving synthetic serving workloads, for the forward tier and the serving
trace (``benchmarks/serving_trace.py``): each scheduled step's requests (cached tokens, tokens
scheduled now, draft tokens, prompt length), with no model run.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase, Request
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import in_order

BLOCK_SIZE = 16
NUM_BLOCKS = 16384  # 262144 tokens of KV cache: enough that nothing is preempted for lack of it


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    budget: int  # max_num_batched_tokens (chunked prefill)
    steps: int
    arrivals_per_step: float  # mean new requests per step (Poisson)
    prompt: Callable[[np.random.Generator], int]
    output: Callable[[np.random.Generator], int]
    shared_prefix: int = 0  # tokens of a system prompt ...
    prefix_share: float = 0.0  # ... that this share of the requests start with
    prefix_caching: bool = False


def _chat(rng: np.random.Generator) -> int:
    return int(rng.integers(50, 1500))


def _long_or_chat(share_long: float) -> Callable[[np.random.Generator], int]:
    def draw(rng: np.random.Generator) -> int:
        if rng.random() < share_long:
            return int(rng.integers(4000, 14000))
        return _chat(rng)

    return draw


def _out(rng: np.random.Generator) -> int:
    return int(rng.integers(32, 400))


WORKLOADS = [
    Workload("chunked-2048", "chat + 20% long prompts, budget 2048", 2048, 600, 0.25,
             _long_or_chat(0.2), _out),
    Workload("chunked-8192", "chat + 20% long prompts, budget 8192", 8192, 600, 0.8,
             _long_or_chat(0.2), _out),
    Workload("prefix-cache-light", "chat, 60% behind a shared 1024-token system prompt, prefix "
             "caching, light load", 8192, 600, 0.15, _chat, _out, 1024, 0.6, True),
    Workload("prefix-cache-heavy", "chat, 60% behind a shared 1024-token system prompt, prefix "
             "caching, heavy load", 8192, 600, 1.5, _chat, _out, 1024, 0.6, True),
    Workload("long-context-mix", "50% prompts of 4k-14k tokens mixed with chat, budget 16384",
             16384, 600, 0.5, _long_or_chat(0.5), _out),
]  # fmt: skip


def make_scheduler(config: Any, workload: Workload) -> Any:
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    config.cache_config.enable_prefix_caching = workload.prefix_caching
    config.cache_config.num_gpu_blocks = NUM_BLOCKS  # what the engine sets after profiling
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], samples.kv_cache_spec(config))],
    )
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
    )


def make_request(req_id: str, prompt: list[int], max_tokens: int, hasher: Any) -> Any:
    from vllm import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(req_id, prompt, params, None, block_hasher=hasher)


def steps_of(workload: Workload, config: Any, seed: int) -> list[dict[str, Any]]:
    """Drive the scheduler; return each step's requests (id, context, query, drafts)."""
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput

    rng = np.random.default_rng(seed)
    scheduler = make_scheduler(config, workload)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK_SIZE, sha256)
    system = [int(t) for t in rng.integers(1, 1000, workload.shared_prefix)]
    steps, next_id, prompt_lens = [], 0, {}
    for _ in range(workload.steps):
        for _ in range(rng.poisson(workload.arrivals_per_step)):
            prompt = system if rng.random() < workload.prefix_share else []
            prompt = prompt + [int(t) for t in rng.integers(1, 1000, workload.prompt(rng))]
            req_id = f"r{next_id}"
            next_id += 1
            prompt_lens[req_id] = len(prompt)
            scheduler.add_request(make_request(req_id, prompt, workload.output(rng), hasher))
        out = scheduler.schedule()
        if not out.num_scheduled_tokens:
            continue
        computed = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        steps.append(
            {
                "num_tokens": dict(out.num_scheduled_tokens),
                "computed": computed,
                "drafts": {k: list(v) for k, v in out.scheduled_spec_decode_tokens.items()},
                "prompt_lens": {r: prompt_lens[r] for r in out.num_scheduled_tokens},
            }
        )
        req_ids = list(out.num_scheduled_tokens)
        sampled = [
            [7] if computed[r] + out.num_scheduled_tokens[r] >= prompt_lens[r] else []
            for r in req_ids
        ]
        fields = {f.name for f in dataclasses.fields(ModelRunnerOutput)}
        index = {r: i for i, r in enumerate(req_ids)}  # a field up to 0.33.0; 0.34.0 derives it
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            sampled_token_ids=sampled,
            **({"req_id_to_index": index} if "req_id_to_index" in fields else {}),
        )
        scheduler.update_from_output(out, runner_output)
    return steps


def from_scheduler_step(name: str, step: dict, order: str, **settings: object) -> ForwardCase:
    """A forward case from one step of :func:`steps_of`."""
    requests = tuple(
        Request(
            req_id,
            step["computed"][req_id],
            tokens,
            len(step["drafts"].get(req_id, ())),
            step["prompt_lens"][req_id],
        )
        for req_id, tokens in step["num_tokens"].items()
    )
    return ForwardCase(name, requests, order, **settings)  # type: ignore[arg-type]


def prompt_before_context(case: ForwardCase) -> bool:
    """Whether the case's order puts a new prompt longer than the threshold before a row with
    context: the layout that makes a split assuming region order drop that row's context."""
    rows = in_order(case.requests, case.order, case.threshold)
    return any(
        not row.context_len
        and row.query_len > case.threshold
        and any(later.context_len for later in rows[index + 1 :])
        for index, row in enumerate(rows)
    )


SCHEDULER_WORKLOADS = ("chunked-2048", "prefix-cache-heavy")


def scheduler_cases(
    workloads: Sequence[str] = SCHEDULER_WORKLOADS,
    steps: int = 300,
    per_workload: int = 1,
    max_tokens: int = 2048,
    max_context: int = 40000,
    seed: int = 0,
) -> list[ForwardCase]:
    """Steps of vLLM's Scheduler on the serving trace's workloads whose model-runner V2 order puts
    a new prompt before a row with context (within the size limits, so that the interpreter stays
    quick), each in V2 order and in V1 order. One query head and one KV head."""
    selected: list[ForwardCase] = []
    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as model_dir:
        samples.write_tiny_llama(model_dir)
        for workload in WORKLOADS:
            if workload.name not in workloads:
                continue
            config = samples.tiny_vllm_config(
                model_dir, max_num_seqs=256, max_num_batched_tokens=workload.budget
            )
            found = 0
            trace = steps_of(dataclasses.replace(workload, steps=steps), config, seed)
            for index, step in enumerate(trace):
                tokens, context = sum(step["num_tokens"].values()), sum(step["computed"].values())
                if tokens > max_tokens or context > max_context:
                    continue
                name = f"scheduler-{workload.name}-step{index}"
                case = from_scheduler_step(name, step, "v2", num_heads=1, num_kv_heads=1)
                if not prompt_before_context(case):
                    continue
                selected += [case, dataclasses.replace(case, name=f"{name}-v1", order="v1")]
                found += 1
                if found == per_workload:
                    break
    return selected
