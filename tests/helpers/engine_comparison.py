"""The engine tier's judgement: each request served with ``ROCM_AITER_FA`` against the same
request served by the run's oracle (vLLM's ``CPU_ATTN`` where this vLLM compiles its CPU
ops) in the same engine, runner, model and prompts."""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.engine_runs import ENGINE_ENV, ENGINE_RUNS, EngineRun
from vllm_rocm_aiter_plugin.diagnostics import child

ULPS = 8
"""A logprob may differ from the oracle's by this many float16 steps at the logits' magnitude:
the model runs in float16 (AITER's kernels take no float32), so attention outputs and logits are
rounded to it, and CPU_ATTN and the references round at different points (CPU_ATTN's kernels
differ by instruction set, too). A request that loses its context differs by far more, and in
its tokens."""
LOGIT_MAGNITUDE = 4.0
"""The logits' magnitude in the tier's models (weights of std 0.1): a logprob's error comes from
theirs, so a logprob nearer 0 is allowed no less."""

SERVERS = {
    "CPU_ATTN": ("CPU_ATTN", {}, False),
    "ONE_PER_STEP": ("ROCM_AITER_FA", {"VLLM_ROCM_AITER_PLUGIN": "off"}, True),
    "plugin": ("ROCM_AITER_FA", {}, False),
    "observe": ("ROCM_AITER_FA", {"VLLM_ROCM_AITER_PLUGIN": "observe"}, False),
}
"""Who serves (backend, environment, one request per step): the oracles, then ``ROCM_AITER_FA``
with the plugin and in observe mode: stock's split, build and impl (stock's output, which the
forward tier checks row by row), counted."""

ORACLES = {
    "CPU_ATTN": "vLLM's CPU_ATTN in the same engine, runner, model and prompts",
    "ONE_PER_STEP": (
        "stock ROCM_AITER_FA with one request per step (max_num_seqs=1), where no step mixes a "
        "new prompt with a row that has context, so stock's split cannot misplace one; the "
        "oracle of every run where CPU_ATTN cannot run (missing_cpu_ops). CPU_ATTN "
        "is no oracle for an fp8 cache: ROCM_AITER_FA's prefill and new-token calls attend to "
        "this step's K/V before it is quantised, CPU_ATTN reads every token back from the fp8 "
        "cache, and the two differ by the quantisation, in tokens too. The run cuts each "
        "request into the same steps alone as beside others, so both read the same K/V"
    ),
}
"""The reference each run's requests are judged against (:func:`oracle_of`)."""


@functools.cache
def missing_cpu_ops() -> str | None:
    """Why this vLLM cannot run ``CPU_ATTN`` (its CPU ops are not compiled: the official wheel,
    as the test platform finds it), or None."""
    from aiter_fa_on_cpu import missing_cpu_ops as platform_finds

    return platform_finds()


def oracle_of(run: EngineRun) -> str:
    """``run.oracle``; where ``CPU_ATTN`` cannot run (:func:`missing_cpu_ops`), stock
    ``ROCM_AITER_FA`` one request per step (``docs/testing.md`` names the routes tried)."""
    if run.oracle == "CPU_ATTN" and missing_cpu_ops() is not None:
        return "ONE_PER_STEP"
    return run.oracle


def tolerance(logprob: float) -> float:
    """``ULPS`` float16 steps (10 mantissa bits) at ``logprob``'s magnitude, at least the
    logits' (``LOGIT_MAGNITUDE``)."""
    magnitude = max(abs(logprob), LOGIT_MAGNITUDE)
    return ULPS * 2.0 ** (math.floor(math.log2(magnitude)) - 10)


@dataclass
class Comparison:
    """One run served by one backend, request by request against the oracle's run."""

    run: str
    error: str | None
    equal: list[bool] = field(default_factory=list)
    largest_logprob_difference: float = 0.0

    @property
    def total(self) -> int:
        return len(self.equal)


def compare(served: dict[str, Any], oracle: dict[str, Any]) -> Comparison:
    """``served`` request by request against ``oracle`` (the same run); an oracle that
    could not serve it is the tier's own failure, never a verdict."""
    if "error" in oracle:
        raise RuntimeError(
            f"the oracle could not serve {oracle['run']}: {oracle['error']}\n"
            f"{oracle.get('traceback', '')}"
        )
    wanted = oracle["requests"]
    if "error" in served:
        return Comparison(served["run"], served["error"], [False] * len(wanted))
    result = Comparison(served["run"], None)
    for got, want in zip(served["requests"], wanted, strict=True):
        same = got["tokens"] == want["tokens"] and len(got["logprobs"]) == len(want["logprobs"])
        for a, b in zip(got["logprobs"], want["logprobs"], strict=False):
            difference = abs(a - b)
            result.largest_logprob_difference = max(result.largest_logprob_difference, difference)
            same = same and difference <= tolerance(b)
        result.equal.append(same)
    return result


def runs_of(server: str) -> list[str]:
    """The runs ``server`` serves: an oracle its own, the backends under test all."""
    return [r.name for r in ENGINE_RUNS if server not in ORACLES or oracle_of(r) == server]


def serve_all(models: Path, timeout: float = 1800) -> dict[str, dict[str, dict]]:
    """Every server with runs (``SERVERS``), each in a new interpreter with the tier's
    environment, as many at once as the machine has cores; their results by run name."""
    servers = [server for server in SERVERS if runs_of(server)]
    at_once = max(1, min(len(servers), os.cpu_count() or 1))
    results: dict[str, dict[str, dict]] = {}
    for first in range(0, len(servers), at_once):
        batch = servers[first : first + at_once]
        started = [(server, _start(server, models, timeout)) for server in batch]
        try:
            results.update((server, _finish(server, begun)) for server, begun in started)
        finally:  # one that failed leaves none of its batch running
            for _, begun in started:
                if begun.process.poll() is None:
                    begun.process.kill()
    return results


def _start(server: str, models: Path, timeout: float) -> child.Started:
    backend, extra, one_per_step = SERVERS[server]
    request = {"attention": backend, "models": str(models), "runs": runs_of(server),
               "one_request_per_step": one_per_step}  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    env = {"VLLM_ROCM_AITER_PLUGIN": None, **ENGINE_ENV, **extra, "PYTHONPATH": path}
    return child.call("tests.helpers.engine_runs:serve_all", request, env=env, cwd=str(root),
                      timeout=timeout)  # fmt: skip


def _finish(server: str, started: child.Started) -> dict[str, dict]:
    done = child.finish(started)
    results, names = done.result or {}, runs_of(server)
    if done.returncode != 0 or sorted(results) != sorted(names):
        raise RuntimeError(
            f"the engine child ({server}) exited {done.returncode} with {sorted(results)} of "
            f"{names}:\n{done.output[-4000:]}"
        )
    return results


def summary_line(
    release: str, plugin: list[Comparison], stock: list[Comparison], oracles: dict[str, str]
) -> str:
    """``engine <release>: plugin k/n requests equal CPU_ATTN (...); stock (observe mode) j/n``,
    naming each run's oracle (``oracles``: run name to ``ORACLES`` key)."""
    n = sum(c.total for c in plugin)
    k = sum(sum(c.equal) for c in plugin)
    j = sum(sum(c.equal) for c in stock)
    others = sorted(name for name, oracle in oracles.items() if oracle != "CPU_ATTN")
    if len(others) == len(oracles):
        judged = "stock ROCM_AITER_FA one request per step"
    else:
        note = f" ({', '.join(others)}: one request per step)" if others else ""
        judged = f"CPU_ATTN{note}"
    return f"engine {release}: plugin {k}/{n} requests equal {judged}; stock (observe mode) {j}/{n}"
