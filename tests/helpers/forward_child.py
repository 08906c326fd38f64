"""The forward tier's runner with what only the tests run: vLLM's Scheduler steps as cases, the
CUDA-graph replay cases and planted defects. ``python -m tests.helpers.forward_child`` (the
repository's root on ``PYTHONPATH``) takes the shipped runner's arguments and these."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.helpers import forward_mutations, graph_replay, scheduler_trace
from vllm_rocm_aiter_plugin.diagnostics.forward import runner

ROOT = Path(__file__).resolve().parents[2]


def _graph_replays(wanted: bool, kinds: Sequence[str]) -> dict[str, Any]:
    """The report's ``graph_replays`` entry, computed with the runner, where ``wanted``."""
    return {"graph_replays": functools.partial(graph_replay.run_all, kinds=kinds)} if wanted else {}


def _with_mutations(
    mutations: Sequence[str], produce: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``produce()``'s report with ``mutations`` planted around it, and named in it."""
    with forward_mutations.planted(mutations):
        report = produce()
    report["mutations"] = list(mutations)
    return report


def run(
    *, graph_replays: bool = False, mutations: Sequence[str] = (), **settings: Any
) -> dict[str, Any]:
    """:func:`runner.run` in this process, with the tests' additions."""
    extra = _graph_replays(graph_replays, settings.get("kinds", runner.KINDS))
    return _with_mutations(mutations, lambda: runner.run(**settings, extra=extra))


def run_in_child(
    *,
    scheduler_steps: bool = False,
    graph_replays: bool = False,
    mutations: Sequence[str] = (),
    extra_env: dict[str, str] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """:func:`runner.run_in_child` through this module, the repository's root on the path."""
    args = ["--scheduler-steps"] if scheduler_steps else []
    args += ["--graph-replay"] if graph_replays else []
    args += ["--mutate", *mutations] if mutations else []
    env = dict(extra_env or {})
    path = env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), path]))
    return runner.run_in_child(module=__name__, extra_args=args, extra_env=env, **settings)


def main(argv: list[str] | None = None) -> int:
    parser: argparse.ArgumentParser = runner.argument_parser()
    parser.add_argument(
        "--scheduler-steps",
        action="store_true",
        help="also run steps of vLLM's Scheduler on the serving trace's workloads",
    )
    parser.add_argument(
        "--graph-replay", action="store_true", help="also run the CUDA-graph replay cases"
    )
    parser.add_argument("--mutate", nargs="*", default=(),
                        choices=sorted(forward_mutations.MUTATIONS),
                        help="plant a defect the tier must catch")  # fmt: skip
    args = parser.parse_args(argv)
    more = scheduler_trace.scheduler_cases() if args.scheduler_steps else []
    extra = _graph_replays(args.graph_replay, args.kinds)
    report = _with_mutations(args.mutate, lambda: runner.run_parsed(args, more, extra))
    return runner.emit(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
