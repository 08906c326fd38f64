"""How often stock ROCM_AITER_FA drops context in model-runner V2 order, on vLLM's own Scheduler."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_builder import cpu_name, pyplot  # benchmarks/ is sys.path[0] when run as a script
from trace_tables import trace_forward_table, trace_table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.helpers: the Scheduler
from tests.helpers.scheduler_trace import (
    WORKLOADS,
    Workload,
    from_scheduler_step,
    steps_of,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import (
    v1_order,
    v2_order,
    v2_order_source,
    why_no_v1_order,
)
from vllm_rocm_aiter_plugin.diagnostics.regions import context_rows_in_prefill

FORWARD_MAX_TOKENS = 2048
"""Steps sampled for the attention-output view have at most this many scheduled tokens (vLLM's
Triton merge runs in the interpreter on CPU, in time that grows with tokens times heads)."""


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
    if why_no_v1_order() is not None:
        row["v1_stock_steps"] = None  # no V1 runner on this vLLM: no V1 order to count
    batches = []
    for step in steps:
        num_tokens, computed = step["num_tokens"], step["computed"]
        row["requests"].update(num_tokens)
        orders = [(v2_order(num_tokens, step["drafts"], threshold), "")]
        if why_no_v1_order() is None:  # a release with the V1 runner: its order beside V2's
            orders.append((v1_order(num_tokens, computed, step["prompt_lens"], threshold), "v1_"))
        for order, key in orders:
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


def forward_sample(workload: Workload, steps: list[dict[str, Any]], count: int) -> list[Any]:
    """Up to ``count`` mixed steps (at most ``FORWARD_MAX_TOKENS`` scheduled tokens), spread
    evenly over the trace, as forward cases in V2 order."""
    eligible = [
        i
        for i, step in enumerate(steps)
        if max(step["num_tokens"].values()) > 1
        and sum(step["num_tokens"].values()) <= FORWARD_MAX_TOKENS
    ]
    picked = [eligible[round(k * len(eligible) / count)] for k in range(min(count, len(eligible)))]
    return [
        from_scheduler_step(f"{workload.name}-{i}", steps[i], "v2", num_heads=1, num_kv_heads=1)
        for i in picked
    ]


def run_forward(sampled: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Every workload's sampled steps through vLLM's real forward (the forward tier's runner, one
    fresh process): in V2 order with stock's backend and the plugin's, in V1 order with stock's
    for its chunk count. The results by workload."""
    from vllm_rocm_aiter_plugin.diagnostics.forward import runner
    from vllm_rocm_aiter_plugin.diagnostics.forward.report import ForwardRequest

    cases = [case for workload in sampled.values() for case in workload]
    ran = iter(runner.run_in_child(ForwardRequest(cases), timeout=7200).cases if cases else [])
    return {name: [next(ran) for _ in workload] for name, workload in sampled.items()}


def forward_view(cases: list[Any]) -> dict[str, Any]:
    """Per workload: wrong and NaN requests for stock and the plugin (V2 order), and context
    chunks per step, stock in V1 order against the plugin in V2 order."""
    view: dict[str, Any] = {"forward_steps": len(cases)}
    for kind in ("stock", "plugin"):
        wrong = nan = requests = 0
        for case in cases:
            result = case[kind]
            requests += len(result.rows)
            wrong += len(result.wrong(case.tolerance))
            nan += len(result.nan())
        view.update({f"{kind}_wrong": wrong, f"{kind}_nan": nan, "forward_requests": requests})
    view["v1_stock_chunks"] = [c.v1_stock_chunks for c in cases]
    view["plugin_chunks"] = [c["plugin"].chunks for c in cases]
    return view


def render_markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    text = trace_table(rows, info)
    if any(r.get("forward_steps") for r in rows):
        text += (
            f"\n\nAttention output, vLLM's real ROCM_AITER_FA forward on a sample of mixed steps "
            f"(at most {FORWARD_MAX_TOKENS} scheduled tokens; {info['forward_kernels']}); a "
            "request is wrong when any of its outputs is off the dense reference or not finite:\n\n"
            + trace_forward_table(rows)
        )
    return text


def plot(rows: list[dict[str, Any]], path: str, info: dict[str, Any]) -> None:
    plt = pyplot()

    names = [r["workload"] for r in rows]
    x = np.arange(len(rows))
    with_forward = any(r.get("forward_steps") for r in rows)
    fig, axes = plt.subplots(1, 3 if with_forward else 2, figsize=(19 if with_forward else 13, 4.8))
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
    if with_forward:
        requests = [max(r.get("forward_requests", 0), 1) for r in rows]
        axes[2].bar(x - 0.2, [share(r.get("stock_wrong", 0), n) for r, n in zip(rows, requests,
                    strict=True)], 0.4, label="stock: wrong output (% of requests)")  # fmt: skip
        axes[2].bar(x + 0.2, [share(r.get("plugin_wrong", 0), n) for r, n in zip(rows, requests,
                    strict=True)], 0.4, label="plugin: wrong output (% of requests)")  # fmt: skip
        axes[2].set_ylabel("% of requests in the sampled steps")
        axes[2].set_title("attention output vs dense reference (vLLM's forward)")
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
    parser.add_argument(
        "--forward-steps",
        type=int,
        default=0,
        help="mixed steps per workload run through vLLM's forward (attention-output view)",
    )
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH")
    parser.add_argument("--plot", metavar="PNG")
    args = parser.parse_args(argv)

    import vllm
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionMetadataBuilder

    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
    from vllm_rocm_aiter_plugin.diagnostics import samples

    torch.set_num_threads(1)
    model_dir = samples.write_tiny_llama()
    rows = []
    sampled: dict[str, list[Any]] = {}
    for workload in WORKLOADS:
        if args.workloads and workload.name not in args.workloads:
            continue
        if args.steps:
            workload = dataclasses.replace(workload, steps=args.steps)
        config = samples.tiny_vllm_config(
            model_dir, max_num_seqs=256, max_num_batched_tokens=workload.budget
        )
        layer = samples.attention_layer(config)
        spec = samples.kv_cache_spec(config)
        builders = (
            AiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu")),
            PluginAiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu")),
        )
        steps = steps_of(workload, config, args.seed)
        rows.append(analyse(workload, steps, builders))
        if args.forward_steps:
            sampled[workload.name] = forward_sample(workload, steps, args.forward_steps)
    if args.forward_steps:
        for row, cases in zip(rows, run_forward(sampled).values(), strict=True):
            row.update(forward_view(cases))
    for row in rows:
        print(json.dumps(row), flush=True)
    info = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "cpu": cpu_name(),
        "v2_order": v2_order_source(),
        "forward_kernels": "vLLM's Triton merge and gather under the interpreter, torch "
        "references for AITER's kernels",
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
