"""How often stock ROCM_AITER_FA drops context in model-runner V2 order, on vLLM's own Scheduler.

Run: ``bash scripts/nox -s trace`` (writes benchmarks/results/serving_trace.{json,md,png}), or
``python benchmarks/serving_trace.py`` in any environment with vLLM and the plugin installed.

No model runs. For each synthetic workload, vLLM's ``Scheduler`` (chunked prefill, prefix caching
where the workload says so) schedules steps over a tiny Llama config; every scheduled request then
"samples" one token once its prompt is done, so requests decode until their ``max_tokens`` and
finish as in serving. Each step is laid out as model-runner V2 lays it out (the installed vLLM's
``sort_batch_req_ids``, or 0.23.0's sort by query length) and, for comparison, in V1 region order.

Reported per workload:
- steps where stock's split puts a row with context in the prefill region (which attends only to
  the new tokens: that request silently loses its context), as a count and a share of the steps
  that have any row above the threshold; the same for the plugin (must be 0) and for V1 order;
- requests affected at least once (stock, plugin);
- total ``build()`` time over the trace, stock builder vs plugin builder, on the V2-ordered steps
  (both inside ``unpinned_host_memory()`` on CPU, as in bench_builder.py), measured side by side.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from bench_builder import cpu_name, pyplot  # benchmarks/ is sys.path[0] when run as a script

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

    from vllm_rocm_aiter_plugin.diagnostics import samples

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


def v2_order(num_tokens: dict[str, int], drafts: dict[str, list[int]], decode_len: int) -> list:
    from vllm.v1.worker.gpu import model_runner

    sort = getattr(model_runner, "sort_batch_req_ids", None)
    if sort is None:
        return sorted(num_tokens, key=num_tokens.get)  # 0.23.0 GPUModelRunner.prepare_inputs
    known = {
        "num_tokens_per_req": num_tokens,
        "draft_tokens": drafts,
        "decode_query_len": decode_len,
    }
    return sort(**{name: known[name] for name in inspect.signature(sort).parameters})


def v1_order(num_tokens: dict[str, int], computed: dict[str, int], threshold: int) -> list:
    """Regions of ``reorder_batch_to_split_decodes_and_prefills``: decode/short extend (context,
    short), long extend (context, long), prefill (no context)."""

    def region(r: str) -> int:
        if not computed[r]:
            return 2
        return 0 if num_tokens[r] <= threshold else 1

    return sorted(num_tokens, key=region)


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
            }
        )
        req_ids = list(out.num_scheduled_tokens)
        sampled = [
            [7] if computed[r] + out.num_scheduled_tokens[r] >= prompt_lens[r] else []
            for r in req_ids
        ]
        runner_output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        scheduler.update_from_output(out, runner_output)
    return steps


def context_rows_in_prefill(counts: tuple, query: list[int], seq: list[int]) -> list[int]:
    first_prefill = int(counts[0]) + int(counts[1])
    return [row for row in range(first_prefill, len(query)) if seq[row] > query[row]]


def analyse(workload: Workload, steps: list[dict[str, Any]], builders: Any) -> dict[str, Any]:
    from vllm.v1.attention.backends import utils as stock_utils

    from vllm_rocm_aiter_plugin.diagnostics import samples
    from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory
    from vllm_rocm_aiter_plugin.split import split_decodes_prefills_and_extends as plugin_split

    stock_builder, plugin_builder = builders
    threshold = 1
    row = {
        "workload": workload.name, "description": workload.description, "steps": len(steps),
        "mixed_steps": 0, "stock_steps": 0, "plugin_steps": 0, "v1_stock_steps": 0,
        "requests": set(), "stock_requests": set(), "plugin_requests": set(),
        "build_stock_s": 0.0, "build_plugin_s": 0.0,
    }  # fmt: skip
    batches = []
    for step in steps:
        num_tokens, computed = step["num_tokens"], step["computed"]
        row["requests"].update(num_tokens)
        for order, key in (
            (v2_order(num_tokens, step["drafts"], threshold), ""),
            (v1_order(num_tokens, computed, threshold), "v1_"),
        ):
            query = [num_tokens[r] for r in order]
            seq = [computed[r] + num_tokens[r] for r in order]
            batch = samples.make_batch(query, seq)
            if not key:
                batches.append(batch)
                row["mixed_steps"] += max(query) > threshold
            lost = context_rows_in_prefill(
                stock_utils.split_decodes_prefills_and_extends(batch, threshold), query, seq
            )
            if lost:
                row[f"{key}stock_steps"] += 1
                if not key:
                    row["stock_requests"].update(order[i] for i in lost)
            if not key:
                plugin_lost = context_rows_in_prefill(plugin_split(batch, threshold), query, seq)
                row["plugin_steps"] += bool(plugin_lost)
                row["plugin_requests"].update(order[i] for i in plugin_lost)

    # build() over the whole trace, stock and plugin alternating per round of the whole trace.
    for _ in range(3):
        for builder, key in ((stock_builder, "stock"), (plugin_builder, "plugin")):
            start = time.perf_counter()
            with unpinned_host_memory():
                for batch in batches:
                    builder.build(0, batch)
            elapsed = time.perf_counter() - start
            best = row[f"build_{key}_s"]
            row[f"build_{key}_s"] = elapsed if not best else min(best, elapsed)
    for key in ("requests", "stock_requests", "plugin_requests"):
        row[key] = len(row[key])
    return row


def render_markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    pct = lambda a, b: f"{100 * a / b:.1f}%" if b else "-"  # noqa: E731
    lines = [
        f"vLLM {info['vllm']} Scheduler, torch {info['torch']}, {info['cpu']}, model-runner V2 "
        f"order from {info['v2_order']}; threshold 1 (no speculation)",
        "",
        "| workload | steps | mixed steps | stock drops context: steps (% of mixed) | plugin | "
        "V1 order, stock | requests | requests hit (stock) | requests hit (plugin) | "
        "build() stock s | build() plugin s | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['workload']} | {r['steps']} | {r['mixed_steps']} "
            f"| {r['stock_steps']} ({pct(r['stock_steps'], r['mixed_steps'])}) "
            f"| {r['plugin_steps']} | {r['v1_stock_steps']} | {r['requests']} "
            f"| {r['stock_requests']} ({pct(r['stock_requests'], r['requests'])}) "
            f"| {r['plugin_requests']} | {r['build_stock_s']:.3f} | {r['build_plugin_s']:.3f} "
            f"| {r['build_stock_s'] / r['build_plugin_s']:.1f}x |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str, info: dict[str, Any]) -> None:
    plt = pyplot()

    names = [r["workload"] for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    share = lambda a, b: 100 * a / b if b else 0  # noqa: E731
    axes[0].bar(x - 0.2, [share(r["stock_steps"], r["mixed_steps"]) for r in rows], 0.4,
                label="stock: steps dropping context (% of mixed steps)")  # fmt: skip
    axes[0].bar(x + 0.2, [share(r["stock_requests"], r["requests"]) for r in rows], 0.4,
                label="stock: requests hit (% of requests)")  # fmt: skip
    axes[0].plot(x, [r["plugin_steps"] for r in rows], "k*", markersize=10, label="plugin (0)")
    axes[0].set_ylabel("%")
    axes[0].set_title("context silently dropped, model-runner V2 order")
    axes[1].bar(x - 0.2, [r["build_stock_s"] for r in rows], 0.4, label="stock build()")
    axes[1].bar(x + 0.2, [r["build_plugin_s"] for r in rows], 0.4, label="plugin build()")
    axes[1].set_ylabel("seconds over the trace")
    axes[1].set_title("total build() time")
    for ax in axes:
        ax.set_xticks(x, names, rotation=20, fontsize=8)
        ax.legend(fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(f"vLLM {info['vllm']} Scheduler on CPU, {info['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="*", default=None)
    parser.add_argument("--steps", type=int, default=None, help="steps per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args(argv)

    import vllm
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder
    from vllm.v1.worker.gpu import model_runner

    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
    from vllm_rocm_aiter_plugin.diagnostics import samples

    torch.set_num_threads(1)
    model_dir = samples.write_tiny_llama()
    rows = []
    for workload in WORKLOADS:
        if args.workloads and workload.name not in args.workloads:
            continue
        if args.steps:
            workload = Workload(**{**workload.__dict__, "steps": args.steps})
        config = samples.tiny_vllm_config(
            model_dir, max_num_seqs=256, max_num_batched_tokens=workload.budget
        )
        layer = samples.attention_layer(config)
        spec = samples.kv_cache_spec(config)
        builders = (
            AiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu")),
            PluginAiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu")),
        )
        row = analyse(workload, steps_of(workload, config, args.seed), builders)
        rows.append(row)
        print(json.dumps(row), flush=True)
    info = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "v2_order": (
            "vLLM's sort_batch_req_ids"
            if hasattr(model_runner, "sort_batch_req_ids")
            else "query length (0.23.0 prepare_inputs)"
        ),
    }
    table = render_markdown(rows, info)
    print()
    print(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.plot:
        plot(rows, args.plot, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
