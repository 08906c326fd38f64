"""``vllm serve`` as operators launch it (the engine core in a process of its own), on the engine
tier's CPU platform: after a workload that exposes rows, ``/metrics`` shows the exposure counters,
in vLLM's naming, equal to the totals of the plugin's log line."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.engine_runs import BLOCK_SIZE, ENGINE_ENV, ENGINE_RUNS_BY_NAME, save_models
from tests.helpers.subprocess_util import REPO_ROOT, scrubbed_env

pytestmark = pytest.mark.engine

LOGGED = re.compile(r"Since start: (\d+) request-steps in (\d+) steps, (\d+) cached tokens\.", re.M)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _complete(url: str, prompt: list[int]) -> None:
    body = {"model": "llama", "prompt": prompt, "max_tokens": 4, "temperature": 0.0,
            "ignore_eos": True}  # fmt: skip
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=600) as response:
        assert response.status == 200


def _missing_for_serve() -> str | None:
    """The package ``vllm serve``'s command line imports and this environment lacks, or None.
    vLLM 0.23.0's imports mistral_common (its Mistral tool parser), whose releases on the package
    index require numpy<2.4, below the suite's lock; the engine tier's CI release has all of them."""
    done = subprocess.run([sys.executable, "-c", "import vllm.entrypoints.cli.launch"],
                          capture_output=True, text=True, env=scrubbed_env(ENGINE_ENV),
                          stdin=subprocess.DEVNULL, timeout=300)  # fmt: skip
    missing = re.search(r"ModuleNotFoundError: No module named '([^'.]+)", done.stderr)
    return missing.group(1) if missing and missing.group(1) != "vllm" else None


def test_metrics_equal_the_log_lines_totals_after_exposed_rows(tmp_path: Path) -> None:
    missing = _missing_for_serve()
    if missing is not None:
        pytest.skip(f"vllm serve cannot start in this environment: it imports {missing}")
    save_models(tmp_path)
    port, log = _port(), tmp_path / "serve.log"
    env = scrubbed_env({**ENGINE_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
                        "VLLM_LOG_STATS_INTERVAL": "1",
                        "PYTHONPATH": REPO_ROOT})  # the CPU platform's reference kernels: tests/  # fmt: skip
    command = [
        sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(tmp_path / "llama"),
        "--served-model-name", "llama", "--port", str(port), "--host", "127.0.0.1",
        "--attention-backend", "ROCM_AITER_FA", "--skip-tokenizer-init", "--enforce-eager",
        "--dtype", "float16", "--block-size", str(BLOCK_SIZE), "--max-model-len", "1024",
        "--max-num-batched-tokens", "256", "--enable-chunked-prefill", "--enable-prefix-caching",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                  stdin=subprocess.DEVNULL, cwd=REPO_ROOT)  # fmt: skip
    try:
        deadline = time.monotonic() + 900
        while True:
            assert server.poll() is None, log.read_text()[-4000:]
            try:
                if _get(f"{url}/health") == "":
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(log.read_text()[-4000:]) from None
                time.sleep(2)
        # The long prompt first, the short ones while its first chunk runs: its last chunk
        # shares a step with them (the scheduler serves arrivals first come, first served)
        (first, *_) = ENGINE_RUNS_BY_NAME["prefix-reach"].batches
        threads = [threading.Thread(target=_complete, args=(url, p)) for p in first]
        threads[0].start()
        time.sleep(1)
        for thread in threads[1:]:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(3)  # past the log interval (1 s) and the stat logger's next record
        _complete(url, [1, 2, 3])  # a step after it: the API server records its stats
        metrics = _get(f"{url}/metrics")
    finally:
        server.terminate()
        server.wait(timeout=120)
    said = LOGGED.findall(log.read_text())
    assert said, log.read_text()[-4000:]
    requests, steps, tokens = map(int, said[-1])
    assert requests > 0
    found = {}
    for name in ("exposed_request_steps", "exposed_steps", "unattended_context_tokens"):
        samples = re.findall(rf"^vllm:rocm_aiter_fa_{name}_total\{{(.*)\}} (\S+)$", metrics, re.M)
        ours = {'model_name="llama"', 'engine="0"', 'mode="fixed"'}
        values = [float(v) for labels, v in samples if set(labels.split(",")) == ours]
        assert len(values) == 1, metrics[-3000:]
        found[name] = int(values[0])
    assert found == {"exposed_request_steps": requests, "exposed_steps": steps,
                     "unattended_context_tokens": tokens}  # fmt: skip
