"""What a second, Python-int split path would buy: ``build()`` with the removed one against the one in use.

Until commit ``38e72d2`` the split had two mixed-batch paths: Python ints up to 24 requests, numpy
above. Now one numpy path serves every mixed batch; a second is worth keeping only if ``build()``
measurably saves at least 1% with it. This script loads the removed module from git history (no second copy in
the tree) and times, side by side in one process, on the benchmark's mixed shapes at the sizes
where the removed path applied: each split alone, and the plugin's ``build()`` with each (the
removed path returns counts only, so that build computes the query lengths itself, as it would in
a two-path split). Per row it prints the measured build-level saving and the split-time gap as a
share of ``build()`` (what the saving would be without noise); the verdict reads the rows at the
benchmark's own sizes (``bench_builder.SIZES``) where the removed path applied. Needs a git
checkout with history.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_builder import SIZES as BENCHMARK_SIZES
from bench_builder import make_shapes, paired_median_us

REMOVED_AT = "38e72d2"
REMOVED_PATH = "vllm_rocm_aiter_plugin/split.py"
SHAPES = ("mixed", "mixed-v2", "extend-heavy")
SMALL_BATCH = 24  # the removed path served mixed batches up to this many requests
SIZES = (3, 8, 16, 24)


def load_removed_split() -> types.ModuleType:
    root = Path(__file__).resolve().parents[1]
    source = subprocess.run(
        ["git", "show", f"{REMOVED_AT}:{REMOVED_PATH}"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("removed_split")
    module.__file__ = f"{REMOVED_AT}:{REMOVED_PATH}"
    sys.modules[module.__name__] = module  # dataclasses and annotations look the module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=0.6)
    args = parser.parse_args(argv)

    from vllm_rocm_aiter_plugin import split as split_module
    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder
    from vllm_rocm_aiter_plugin.diagnostics import samples
    from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory
    from vllm_rocm_aiter_plugin.split import BatchSplit, split_batch

    removed = load_removed_split()

    def removed_split_batch(cam, threshold: int) -> BatchSplit:
        return BatchSplit(*removed.split_decodes_prefills_and_extends(cam, threshold))

    torch.set_num_threads(1)
    config = samples.tiny_vllm_config(samples.write_tiny_llama())
    builder = PluginAiterFlashAttentionMetadataBuilder(
        samples.kv_cache_spec(config),
        [samples.attention_layer(config)],
        config,
        torch.device("cpu"),
    )
    shapes = make_shapes(np.random.default_rng(args.seed))
    print(
        f"{'shape':<13}{'reqs':>5}{'split: removed':>15}{'in use':>8}"
        f"{'build(): removed':>18}{'in use':>8}{'saving':>8}{'split gap':>10}"
    )
    verdict: list[tuple[float, float]] = []  # (measured saving, split gap) at benchmark sizes
    # The builder calls the split through one dispatcher in both build() columns, so both pay the
    # same indirection and neither pays for patching.
    chosen = [split_batch]
    dispatch = mock.patch.object(split_module, "split_batch", lambda c, t: chosen[0](c, t))
    for shape in SHAPES:
        for n in args.sizes:
            spec = shapes[shape](n)
            if spec is None:
                continue
            query_lens, seq_lens, threshold = spec
            batch = samples.make_batch(query_lens, seq_lens)
            assert removed.split_decodes_prefills_and_extends(batch, threshold) == (
                split_batch(batch, threshold).counts
            ), (shape, n)
            removed_us, in_use_us = paired_median_us(
                lambda b=batch, t=threshold: removed.split_decodes_prefills_and_extends(b, t),
                lambda b=batch, t=threshold: split_batch(b, t),
                budget_s=args.budget_s,
            )

            def build(split, b=batch) -> object:
                chosen[0] = split
                with unpinned_host_memory():
                    return builder.build(0, b)

            with dispatch:
                build_removed_us, build_in_use_us = paired_median_us(
                    lambda: build(removed_split_batch),
                    lambda: build(split_batch),
                    budget_s=args.budget_s,
                )
            assert removed_us is not None and build_removed_us is not None
            saving = (build_in_use_us - build_removed_us) / build_in_use_us
            gap = (in_use_us - removed_us) / build_in_use_us
            if n in BENCHMARK_SIZES:
                verdict.append((saving, gap))
            print(
                f"{shape:<13}{n:>5}{removed_us:>15.1f}{in_use_us:>8.1f}"
                f"{build_removed_us:>18.1f}{build_in_use_us:>8.1f}{saving:>8.1%}{gap:>10.1%}"
            )
    applied = sorted(n for n in BENCHMARK_SIZES if 1 < n <= SMALL_BATCH)
    if verdict:
        mean_saving = sum(s for s, _ in verdict) / len(verdict)
        print(
            f"at the benchmark's sizes where the removed path applied ({applied}): build() saving "
            f"mean {mean_saving:.1%}, split gap at most {max(g for _, g in verdict):.1%} of build() "
            "(a second path is worth keeping where build() measurably saves >= 1%; the split gap "
            "is the most it could save); above "
            f"{SMALL_BATCH} requests it did not apply"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
