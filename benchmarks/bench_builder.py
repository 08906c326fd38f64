"""Stock vLLM vs the plugin, side by side in one process: split, build(), build()'s host memory,
and what counting the requests stock serves without their context adds to the plugin's build()."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

SIZES = (1, 8, 64, 256, 1024)
TOKEN_BUDGET = 65536
STOCK_BUILD_LIMIT = {"extend-heavy": 256}  # larger sizes: stock build needs > 8 GB of host memory


def make_shapes(
    rng: np.random.Generator,
) -> dict[str, Callable[[int], tuple[list[int], list[int], int] | None]]:
    """shape name -> (num requests -> (query lens, seq lens, threshold) or None if over budget)."""

    def decode(n: int, q: int) -> tuple[list[int], list[int], int]:
        ctx = rng.integers(100, 4000, n)
        return [q] * n, [int(c) + q for c in ctx], q

    def prefill(n: int):
        prompts = [int(p) for p in rng.integers(128, 2049, n)]
        return (prompts, prompts, 1) if sum(prompts) <= TOKEN_BUDGET else None

    def mixed(n: int):
        n_dec, n_ext = max(1, int(n * 0.6)), int(n * 0.2)
        n_pre = max(0, n - n_dec - n_ext)
        q = [1] * n_dec + [int(x) for x in rng.integers(16, 257, n_ext)]
        s = [int(c) + 1 for c in rng.integers(100, 4000, n_dec)]
        s += [qq + int(c) for qq, c in zip(q[n_dec:], rng.integers(256, 4097, n_ext), strict=True)]
        prompts = [int(p) for p in rng.integers(128, 1025, n_pre)]
        q, s = q + prompts, s + prompts
        if n > 1 and max(q) <= 1:
            return None
        return (q, s, 1) if sum(q) <= TOKEN_BUDGET else None

    def extend_heavy(n: int):
        q = [int(x) for x in rng.integers(16, 65, n)]
        s = [qq + int(c) for qq, c in zip(q, rng.integers(2048, 8193, n), strict=True)]
        return (q, s, 1) if sum(q) <= TOKEN_BUDGET else None

    def mixed_v2(n: int):
        """The mixed batch as model-runner V2 lays it out: sorted by query length, so new prompts
        come before longer rows with context (extend regions hold rows without context)."""
        spec = mixed(n)
        if spec is None:
            return None
        q, s, threshold = spec
        order = sorted(range(len(q)), key=q.__getitem__)
        return [q[i] for i in order], [s[i] for i in order], threshold

    return {
        "pure-decode": lambda n: decode(n, 1),
        "eagle-decode": lambda n: decode(n, 4),
        "prefill-only": prefill,
        "mixed": lambda n: mixed(n) if n >= 3 else None,
        "mixed-v2": lambda n: mixed_v2(n) if n >= 3 else None,
        "extend-heavy": extend_heavy,
    }


def paired_median_us(
    stock: Callable[[], Any] | None,
    plugin: Callable[[], Any],
    budget_s: float = 0.6,
    min_reps: int = 3,
    max_reps: int = 4000,
    rounds: int = 10,
) -> tuple[float | None, float]:
    """Medians (µs) of ``stock`` and ``plugin``, timed in alternating rounds of back-to-back calls."""
    calls = [fn for fn in (stock, plugin) if fn is not None]
    start = time.perf_counter()
    for fn in calls:
        fn()
    estimate = time.perf_counter() - start
    reps = int(min(max_reps, max(min_reps, budget_s / max(estimate, 1e-7))))
    per_round = max(1, reps // rounds)
    samples: list[list[int]] = [[] for _ in calls]
    for _ in range(max(1, reps // per_round)):
        for fn, out in zip(calls, samples, strict=True):
            fn()  # untimed: warms what the other function's round evicted (caches, freed pages)
            for _ in range(per_round):
                t0 = time.perf_counter_ns()
                fn()
                out.append(time.perf_counter_ns() - t0)
    medians = [statistics.median(out) / 1000.0 for out in samples]
    return (medians[0] if stock is not None else None), medians[-1]


def _unless_it_raises(
    fn: Callable[[], Any], row: dict[str, Any], key: str
) -> Callable[[], Any] | None:
    """``fn`` if one call succeeds; else None, with the exception's name in ``row[key]``."""
    try:
        fn()
    except Exception as exc:  # reported in the table, not hidden
        row[key] = type(exc).__name__
        return None
    return fn


def memory_profile(fn: Callable[[], Any]) -> tuple[int, int, int]:
    """(peak torch CPU bytes, peak numpy/Python bytes, allocating torch events) of one call."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    live = peak = allocs = 0
    for event in sorted(prof.events(), key=lambda e: e.time_range.start):
        live += event.self_cpu_memory_usage
        peak = max(peak, live)
        allocs += event.self_cpu_memory_usage > 0
    return peak, py_peak, allocs


def count_tensor_ops(fn: Callable[[], Any]) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.name.startswith("aten::"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--shapes", nargs="*", default=None)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--plot", metavar="PNG", help="draw latency vs batch size per shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--budget-s", type=float, default=0.6, help="seconds per paired timing (default 0.6)"
    )
    args = parser.parse_args(argv)

    import vllm
    from vllm.v1.attention.backends import utils as stock_utils
    from vllm.v1.attention.backends.rocm_aiter_fa import (
        AiterFlashAttentionMetadata,
        AiterFlashAttentionMetadataBuilder,
    )

    from vllm_rocm_aiter_plugin import builder
    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
    from vllm_rocm_aiter_plugin.diagnostics import samples
    from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory
    from vllm_rocm_aiter_plugin.split import split_decodes_prefills_and_extends as plugin_split

    torch.set_num_threads(1)
    model_dir = samples.write_tiny_llama()
    builders = {}
    for threshold in (1, 4):
        config = samples.tiny_vllm_config(model_dir, num_speculative_tokens=threshold - 1)
        layer = samples.attention_layer(config)
        spec = samples.kv_cache_spec(config)
        builders[threshold] = (
            AiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu")),
            PluginAiterFlashAttentionMetadataBuilder(spec, [layer], config, torch.device("cpu")),
        )

    rng = np.random.default_rng(args.seed)
    shapes = make_shapes(rng)
    rows: list[dict[str, Any]] = []
    for shape, make in shapes.items():
        if args.shapes and shape not in args.shapes:
            continue
        for n in args.sizes:
            spec = make(n)
            if spec is None:
                continue
            query_lens, seq_lens, threshold = spec
            pure_decode = shape.endswith("decode")
            batch = samples.make_batch(query_lens, seq_lens, with_upper_bound=not pure_decode)
            stock_builder, plugin_builder = builders[threshold]
            has_extends = shape in ("mixed", "mixed-v2", "extend-heavy")
            mode = unpinned_host_memory if has_extends else contextlib.nullcontext
            row: dict[str, Any] = {"shape": shape, "requests": n, "tokens": int(sum(query_lens))}

            stock_split = _unless_it_raises(
                lambda b=batch, t=threshold: stock_utils.split_decodes_prefills_and_extends(b, t),
                row,
                "split_stock_error",
            )
            row["split_stock_us"], row["split_plugin_us"] = paired_median_us(
                stock_split,
                lambda b=batch, t=threshold: plugin_split(b, t),
                budget_s=args.budget_s,
            )
            row["split_plugin_tensor_ops"] = count_tensor_ops(
                lambda b=batch, t=threshold: plugin_split(b, t)
            )

            def run(builder, b=batch, m=mode):
                with m():
                    return builder.build(0, b)

            run_stock = None
            if n <= STOCK_BUILD_LIMIT.get(shape, max(SIZES)):
                run_stock = _unless_it_raises(
                    lambda b=stock_builder: run(b), row, "build_stock_error"
                )
            row["build_stock_us"], row["build_plugin_us"] = paired_median_us(
                run_stock, lambda b=plugin_builder: run(b), budget_s=args.budget_s
            )
            # What counting adds to a build: the split and the record with the count and with
            # the count planted as none (each call a new step, under the same patch)
            uncounted_us, counted_us = paired_median_us(
                lambda b=batch, t=threshold: counting(False, b, t),
                lambda b=batch, t=threshold: counting(True, b, t),
                budget_s=args.budget_s,
            )
            row["counting_us"] = max(0.0, counted_us - uncounted_us)
            if run_stock is not None:
                torch_peak, py_peak, allocs = memory_profile(run_stock)
                row.update(stock_peak_bytes=torch_peak + py_peak, stock_allocs=allocs)
            torch_peak, py_peak, allocs = memory_profile(lambda b=plugin_builder: run(b))
            row.update(plugin_peak_bytes=torch_peak + py_peak, plugin_allocs=allocs)
            rows.append(row)
            print(_format_row(row), flush=True)

    info = {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "own_build_path": builder.own_build_default(),
        # vLLM 0.20-0.21 metadata carries host values of every sequence length (any build reads them)
        "pure_decode_reads_seq_lens": "num_actual_kv_tokens"
        in AiterFlashAttentionMetadata.__dataclass_fields__,
        "python": platform.python_version(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    print()
    print(render_markdown(rows, info))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "rows": rows}, f, indent=1)
    if args.plot:
        plot(rows, args.plot, info)
    return 0


def counting(counted: bool, batch: Any, threshold: int) -> None:
    """The plugin's split of ``batch`` and the exposure record after it, as a new step, with
    ``split._stock_exposure`` as it is (``counted``) or planted as none (nothing recorded)."""
    from unittest import mock

    from vllm_rocm_aiter_plugin import exposure, split

    count = split._stock_exposure if counted else lambda *args: (0, 0)
    exposure.new_step()  # as in serving: each step recorded, not deduplicated
    with mock.patch.object(split, "_stock_exposure", count):
        exposure.record(split.split_batch(batch, threshold), observed=False)


def _share(row: dict[str, Any]) -> str:
    """Counting's time as a share of the plugin's build()."""
    return f"{100 * row['counting_us'] / row['build_plugin_us']:.1f}% of build"


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _ratio(stock: float | None, plugin: float | None) -> str:
    if not stock or not plugin:
        return "-"
    return f"{stock / plugin:.1f}x"


def _format_row(r: dict[str, Any]) -> str:
    return (
        f"{r['shape']:<13} n={r['requests']:<5} split {r['split_stock_us'] or float('nan'):8.1f} -> "
        f"{r['split_plugin_us']:7.2f} us ({_ratio(r['split_stock_us'], r['split_plugin_us'])})  "
        f"build {r.get('build_stock_us') or float('nan'):10.1f} -> {r['build_plugin_us']:9.1f} us "
        f"({_ratio(r.get('build_stock_us'), r['build_plugin_us'])})  counting "
        f"{r['counting_us']:.2f} us ({_share(r)})"
    )


def _stock_cell(r: dict[str, Any], what: str, fmt: str) -> str:
    if r.get(f"{what}_stock_error"):
        return f"raises {r[f'{what}_stock_error']}"
    value = r.get(f"{what}_stock_us")
    return "skipped (>8 GB)" if value is None else format(value, fmt)


def render_markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    mb = lambda b: "-" if b is None else f"{b / 1e6:.2f}"  # noqa: E731
    lines = [
        f"vLLM {info['vllm']}, torch {info['torch']}, {info['cpu']}, {info['cores']} cores "
        f"(torch threads: {info['torch_threads']}), own build path: {info['own_build_path']}",
        "",
        "| shape | reqs | tokens | split stock µs | split plugin µs | split ratio | build stock µs "
        "| build plugin µs | build ratio | counting µs | peak MB stock | peak MB plugin "
        "| allocs stock | allocs plugin |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        stock_build = r.get("build_stock_us")
        lines.append(
            f"| {r['shape']} | {r['requests']} | {r['tokens']} "
            f"| {_stock_cell(r, 'split', '.2f')} "
            f"| {r['split_plugin_us']:.2f} | {_ratio(r['split_stock_us'], r['split_plugin_us'])} "
            f"| {_stock_cell(r, 'build', '.1f')} "
            f"| {r['build_plugin_us']:.1f} | {_ratio(stock_build, r['build_plugin_us'])} "
            f"| {r['counting_us']:.2f} ({_share(r)}) "
            f"| {mb(r.get('stock_peak_bytes'))} | {mb(r.get('plugin_peak_bytes'))} "
            f"| {r.get('stock_allocs', '-')} | {r.get('plugin_allocs', '-')} |"
        )
    return "\n".join(lines)


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(rows: list[dict[str, Any]], path: str, info: dict[str, Any]) -> None:
    plt = pyplot()

    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, what in zip(axes, ("split", "build"), strict=True):
        for color, shape in zip(colors, shapes, strict=False):
            pts = [r for r in rows if r["shape"] == shape]
            stock = [
                (r["requests"], r[f"{what}_stock_us"]) for r in pts if r.get(f"{what}_stock_us")
            ]
            plugin = [(r["requests"], r[f"{what}_plugin_us"]) for r in pts]
            if stock:
                ax.plot(
                    *zip(*stock, strict=True), "--o", color=color, alpha=0.6, label=f"{shape} stock"
                )
            ax.plot(*zip(*plugin, strict=True), "-s", color=color, label=f"{shape} plugin")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("requests in batch")
        ax.set_ylabel("median µs per call")
        ax.set_title(f"{what}: stock (dashed) vs plugin (solid)")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, ncol=2)
    fig.suptitle(f"ROCM_AITER_FA metadata on CPU — vLLM {info['vllm']}, {info['cpu']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
