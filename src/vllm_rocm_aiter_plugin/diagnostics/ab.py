"""``vllm-rocm-aiter-plugin ab``: your prompts through vLLM's engine three times, each in a process
of its own with your engine arguments and greedy decoding: stock ``ROCM_AITER_FA`` (observe mode:
stock's output, its exposure counted), the plugin, and a reference backend without the three-way
split. Per request: where each run parts from the reference; per run: throughput; one verdict."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
import traceback
from collections.abc import Sequence
from typing import Any, cast

from vllm_rocm_aiter_plugin.diagnostics import child

REFERENCE = "TRITON_ATTN"
RUNS = ("reference", "stock", "plugin")
PLUGIN_SWITCH = {"reference": "0", "stock": "observe", "plugin": None}
"""``VLLM_ROCM_AITER_PLUGIN`` in each run's process: the reference with the plugin off (stock vLLM
throughout), stock in observe mode, the plugin as installed."""

EXIT_OK, EXIT_WORSE, EXIT_CHECK_FAILED = 0, 1, 2

Prompt = dict[str, Any]  # what LLM.generate takes: {"prompt": text} or {"prompt_token_ids": [...]}


def read_prompts(path: str) -> list[Prompt]:
    """A JSON Lines file: each line a text (a JSON string), token ids (a list), or an object with
    ``prompt`` or ``prompt_token_ids``."""
    prompts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            item = json.loads(line)
            if isinstance(item, str):
                item = {"prompt": item}
            elif isinstance(item, list):
                item = {"prompt_token_ids": item}
            if not isinstance(item, dict) or not {"prompt", "prompt_token_ids"} & set(item):
                raise ValueError(f"{path}:{number}: neither a text nor token ids")
            prompts.append(item)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def engine_options(args: Sequence[str]) -> dict[str, Any]:
    """vLLM's own parse of engine arguments (``vllm serve``'s spelling): the fields they change
    from ``EngineArgs``'s defaults, as ``LLM`` takes them."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="vllm-rocm-aiter-plugin ab"))
    given = EngineArgs.from_cli_args(parser.parse_args(list(args)))
    default = EngineArgs.from_cli_args(parser.parse_args(["--model", given.model]))
    return {
        f.name: getattr(given, f.name)
        for f in dataclasses.fields(EngineArgs)
        if f.name == "model" or getattr(given, f.name) != getattr(default, f.name)
    }


def _worker_totals(worker: Any) -> dict[str, Any]:
    """In each worker (``LLM.collective_rpc``): its exposure totals."""
    from vllm_rocm_aiter_plugin import exposure

    return exposure.totals()


def _counted(llm: Any) -> int:
    """The request-steps the workers counted so far (only the first rank counts)."""
    return sum(int(t["request_steps"]) for t in llm.collective_rpc(_worker_totals))


def generate(
    options: dict[str, Any],
    batches: list[list[Prompt]],
    max_tokens: int,
    attention: str,
) -> dict[str, Any]:
    """One ``LLM`` with ``options`` and ``attention`` for every attention layer (a speculative
    draft's too, unless it names its own); each batch one greedy ``generate`` call. Returns each
    request's tokens and logprobs, the seconds and tokens generated, the request-steps counted
    without their context by the end of each batch, or the error."""
    from vllm import LLM, SamplingParams

    options = {**options, "attention_backend": attention}
    draft = options.get("speculative_config")
    if isinstance(draft, dict) and "attention_backend" not in draft:
        options["speculative_config"] = {**draft, "attention_backend": attention}
    result: dict[str, Any] = {"attention": attention}
    llm = None
    try:
        llm = LLM(**options)
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=0, ignore_eos=True)
        requests, exposure, seconds = [], [], 0.0
        before = _counted(llm)  # an earlier engine in this process counted in the same totals
        for batch in batches:
            start = time.perf_counter()
            outputs = llm.generate(cast(Any, batch), params)  # dicts of TextPrompt/TokensPrompt
            seconds += time.perf_counter() - start
            for output in outputs:
                completion = output.outputs[0]
                tokens = list(completion.token_ids)
                steps = completion.logprobs or []
                requests.append(
                    {
                        "prompt_tokens": len(output.prompt_token_ids or []),
                        "tokens": tokens,
                        "logprobs": [
                            s[t].logprob if s else None for s, t in zip(steps, tokens, strict=False)
                        ],
                    }
                )
            exposure.append(_counted(llm) - before)
        result.update(requests=requests, exposure=exposure, seconds=seconds)
    except Exception as exc:  # the engine stopped: reported for this run
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-3000:]
    finally:
        del llm
        _release_engine()
    return result


def _release_engine() -> None:
    """What vLLM's own tests do between two ``LLM`` objects in one process."""
    gc.collect()
    try:
        from vllm.distributed import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:
        pass


def serve(request: dict[str, Any]) -> dict[str, Any]:
    """In a run's process (``child.call``): the prompts through ``request["attention"]``."""
    options = engine_options(request["engine_args"])
    return generate(options, [request["prompts"]], request["max_tokens"], request["attention"])


@dataclasses.dataclass
class Outcome:
    """One run against the reference: per request, the first token where it parts (None: same)."""

    run: str
    attention: str
    error: str | None = None
    parts_at: list[int | None] = dataclasses.field(default_factory=list)
    tokens_per_second: float | None = None
    counted: int | None = None  # request-steps served (or, with the plugin, corrected) unaided

    @property
    def differing(self) -> list[int]:
        return [i for i, at in enumerate(self.parts_at) if at is not None]


def parts_at(tokens: list[int], reference: list[int]) -> int | None:
    """The first position where ``tokens`` leaves ``reference``; None where they are equal."""
    for position, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return position
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


def outcome(run: str, served: dict[str, Any], reference: dict[str, Any]) -> Outcome:
    result = Outcome(run, served["attention"], served.get("error"))
    if result.error is None and "error" not in reference:
        result.parts_at = [
            parts_at(got["tokens"], want["tokens"])
            for got, want in zip(served["requests"], reference["requests"], strict=True)
        ]
        generated = sum(len(r["tokens"]) for r in served["requests"])
        result.tokens_per_second = generated / served["seconds"] if served["seconds"] else None
        result.counted = served["exposure"][-1]
    return result


def verdict(outcomes: dict[str, Outcome]) -> tuple[str, int]:
    """The plugin against stock, both judged by the reference: never worse is the bar (two right
    backends can part at a near-tie of the logits, so a request both part on is no finding)."""
    reference, stock, plugin = (outcomes[r] for r in RUNS)
    if reference.error or plugin.error:
        failed = reference if reference.error else plugin
        return f"the {failed.run} run could not serve: {failed.error}", EXIT_CHECK_FAILED
    total = len(plugin.parts_at)
    worse = sorted(set(plugin.differing) - set(stock.differing if not stock.error else []))
    said = (
        f"stock failed ({stock.error})"
        if stock.error
        else f"stock parts from {reference.attention} on {len(stock.differing)} of {total} "
        f"requests ({stock.counted} request-steps served without their context)"
    )
    said += f"; the plugin on {len(plugin.differing)}"
    if worse:
        return (
            f"the plugin is WORSE than stock here: {said}; requests {worse} part only with the "
            "plugin (attach --json to an issue)",
            EXIT_WORSE,
        )
    fixed = len(set(stock.differing) - set(plugin.differing)) if not stock.error else total
    return f"the plugin is never worse than stock here: {said}; {fixed} corrected", EXIT_OK


def run_all(
    model_args: Sequence[str], prompts: list[Prompt], max_tokens: int, reference: str,
    timeout: float = 3600,
) -> dict[str, Any]:  # fmt: skip
    """The three runs, one after another, each in a fresh interpreter (one engine on the GPUs at a
    time); their results and outcomes."""
    served = {}
    for run in RUNS:
        attention = reference if run == "reference" else "ROCM_AITER_FA"
        request = {"engine_args": list(model_args), "prompts": prompts,
                   "max_tokens": max_tokens, "attention": attention}  # fmt: skip
        started = child.call(
            f"{__name__}:serve", request,
            env={"VLLM_ROCM_AITER_PLUGIN": PLUGIN_SWITCH[run]}, timeout=timeout,
        )  # fmt: skip
        done = child.finish(started)
        if done.result is None:
            served[run] = {"attention": attention, "error": f"exited {done.returncode}",
                           "traceback": done.output[-3000:]}  # fmt: skip
        else:
            served[run] = done.result
    outcomes = {run: outcome(run, served[run], served["reference"]) for run in RUNS}
    line, code = verdict(outcomes)
    return {"served": served, "outcomes": outcomes, "verdict": line, "exit": code}


def table(outcomes: dict[str, Outcome], served: dict[str, Any]) -> str:
    """Per request, where stock and the plugin part from the reference; per run, throughput."""

    def cell(o: Outcome, i: int) -> str:
        if o.error:
            return "failed"
        at = o.parts_at[i]
        return "same" if at is None else f"parts at token {at}"

    reference, stock, plugin = (outcomes[r] for r in RUNS)
    lengths = [r["prompt_tokens"] for r in served["reference"].get("requests", [])]
    lines = [f"| request | prompt tokens | stock vs {reference.attention} | plugin vs "
             f"{reference.attention} |", "|---:|---:|---|---|"]  # fmt: skip
    for i in range(len(lengths)):
        lines.append(f"| {i} | {lengths[i]} | {cell(stock, i)} | {cell(plugin, i)} |")
    lines.append("")
    for o in (reference, stock, plugin):
        speed = "failed" if o.error else f"{o.tokens_per_second or 0:.1f} tokens/s"
        lines.append(f"{o.run} ({o.attention}): {speed}")
    return "\n".join(lines)


def run(model_args: Sequence[str], prompts_file: str, max_tokens: int, reference: str,
        as_json: bool) -> int:  # fmt: skip
    """The command: runs, prints the table (or ``--json``) and the verdict; its exit code."""
    prompts = read_prompts(prompts_file)
    done = run_all(model_args, prompts, max_tokens, reference)
    if as_json:
        document = {
            "verdict": done["verdict"], "exit": done["exit"], "reference": reference,
            "max_tokens": max_tokens, "engine_args": list(model_args),
            "runs": {r: dataclasses.asdict(o) for r, o in done["outcomes"].items()},
            "errors": {r: s.get("traceback") for r, s in done["served"].items() if "error" in s},
        }  # fmt: skip
        print(json.dumps(document, indent=1))
    else:
        print(table(done["outcomes"], done["served"]))
        print(f"\nverdict: {done['verdict']}")
    return int(done["exit"])
