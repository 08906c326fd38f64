"""``vllm-rocm-aiter-plugin ab`` as an operator runs it, from the installed wheel, on the engine
tier's CPU platform and tiny Llama: stock parts from the reference on the request the tier knows
it serves without its context (a chunk beside two new prompts), the plugin on none, and both
count that request-step."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.engine_comparison import missing_cpu_ops
from tests.helpers.engine_runs import (
    BLOCK_SIZE,
    ENGINE_ENV,
    ENGINE_RUNS_BY_NAME,
    TOKEN_BUDGET,
    save_models,
)
from tests.helpers.subprocess_util import REPO_ROOT, scrubbed_env

pytestmark = pytest.mark.engine

ENGINE_ARGS = [
    "--skip-tokenizer-init", "--enforce-eager", "--dtype", "float16", "--seed", "0",
    "--gpu-memory-utilization", "0.1", "--max-model-len", "1024", "--block-size", str(BLOCK_SIZE),
    "--max-num-batched-tokens", str(TOKEN_BUDGET), "--enable-chunked-prefill",
    "--enable-prefix-caching",
]  # fmt: skip
"""The engine tier's options, spelled as ``vllm serve`` spells them."""


def test_ab_finds_the_request_stock_serves_without_its_context(tmp_path: Path) -> None:
    if missing_cpu_ops() is not None:
        pytest.skip(f"the reference, CPU_ATTN, cannot run on this vLLM: {missing_cpu_ops()}")
    save_models(tmp_path)
    (first, *_) = ENGINE_RUNS_BY_NAME["prefix-reach"].batches  # 600 tokens, then two new prompts
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in first))
    command = shutil.which("vllm-rocm-aiter-plugin")
    assert command is not None, "the installed wheel's command"
    env = scrubbed_env({**ENGINE_ENV, "PYTHONPATH": REPO_ROOT})  # the platform's references
    done = subprocess.run(
        [command, "ab", str(tmp_path / "llama"), "--prompts", str(prompts), "--max-tokens", "8",
         "--reference", "CPU_ATTN", "--json", *ENGINE_ARGS],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, stdin=subprocess.DEVNULL,
        timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(done.stdout)
    stock, plugin = report["runs"]["stock"], report["runs"]["plugin"]
    assert [i for i, at in enumerate(stock["parts_at"]) if at is not None] == [0], report
    assert plugin["parts_at"] == [None, None, None], report
    assert stock["counted"] == plugin["counted"] == 1, report
    assert report["verdict"].startswith("the plugin is never worse than stock here"), report
    assert all(r["tokens_per_second"] > 0 for r in report["runs"].values()), report
