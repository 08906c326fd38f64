"""Run the CPU suite against several vLLM releases in one environment and write a Markdown table.

Usage (inside an environment built by ``noxfile.py``; ``scripts/nox -s compat`` does it all):
    python scripts/compat.py 0.20.0 0.20.1 ... 0.33.0

For each release: swap vLLM with ``pip install --no-deps --force-reinstall`` (torch and the pinned
dependencies stay), probe whether the stock split crashes on an EAGLE pure-decode batch, run
``pytest`` with a JUnit report, and record the counts. Writes ``compat/results.md`` and
``compat/results.json``; exits non-zero if any release failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import junit_summary  # scripts/ is on sys.path when this file runs as a script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "compat")
JUNIT_DIR = os.path.join(ROOT, "build", "compat")

PROBE = (
    "from vllm_rocm_aiter_plugin.diagnostics.probe import probe_stock_split, probe_stock_v2_order\n"
    "import torch, vllm\n"
    "r, v2 = probe_stock_split(), probe_stock_v2_order()\n"
    "print('@@' + '@@'.join(['yes' if r.affected else 'no', 'yes' if v2.affected else 'no',\n"
    "                        vllm.__version__, torch.__version__]))\n"
)


def _counts(junit: str) -> dict[str, int]:
    c = junit_summary.counts(junit)
    return {"passed": c["passed"], "failed": c["failures"] + c["errors"], "skipped": c["skipped"]}


def run_release(version: str) -> dict[str, object]:
    row: dict[str, object] = {"vllm": version}
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--force-reinstall", f"vllm=={version}"],
        capture_output=True, text=True,
    )  # fmt: skip
    if install.returncode != 0:
        return {**row, "error": "install failed: " + install.stderr.strip()[-300:]}
    probe = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT)
    marker = [line for line in probe.stdout.splitlines() if line.startswith("@@")]
    if not marker:
        return {**row, "error": "vLLM does not import: " + probe.stderr.strip()[-300:]}
    _, affected, drops_context, installed, torch_version = marker[0].split("@@")
    row.update(
        affected=affected, drops_context=drops_context, installed=installed, torch=torch_version
    )
    junit = os.path.join(JUNIT_DIR, f"junit-vllm-{version}.xml")
    start = time.monotonic()
    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    row["seconds"] = round(time.monotonic() - start)
    if not os.path.exists(junit):
        return {**row, "error": "pytest produced no report: " + tests.stdout.strip()[-300:]}
    row.update(_counts(junit))
    if tests.returncode not in (0, 1):
        row["error"] = f"pytest exited {tests.returncode}"
    return row


def markdown(rows: list[dict[str, object]]) -> str:
    lines = [
        "| vLLM | stock crashes on EAGLE decode (probed) | stock drops context in V2 order "
        "(probed) | passed | failed | skipped | seconds |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        if "passed" in r:
            lines.append(
                f"| {r['vllm']} | {r['affected']} | {r.get('drops_context', '-')} | {r['passed']} "
                f"| {r['failed']} | {r['skipped']} | {r['seconds']} |"
            )
        else:
            lines.append(
                f"| {r['vllm']} | {r.get('affected', '-')} | {r.get('drops_context', '-')} "
                f"| - | - | - | {r['error']} |"
            )
    return "\n".join(lines) + "\n"


def main(versions: list[str]) -> int:
    os.makedirs(OUT_DIR, exist_ok=True)
    os.makedirs(JUNIT_DIR, exist_ok=True)
    results_path = os.path.join(OUT_DIR, "results.json")
    previous: dict[str, dict[str, object]] = {}
    if os.path.exists(results_path):  # a partial rerun updates its rows and keeps the others
        with open(results_path) as f:
            previous = {str(r["vllm"]): r for r in json.load(f)}
    ran = []
    for version in versions:
        row = run_release(version)
        ran.append(row)
        previous[version] = row
        print(json.dumps(row), flush=True)
        rows = sorted(previous.values(), key=lambda r: tuple(map(int, str(r["vllm"]).split("."))))
        with open(results_path, "w") as f:
            json.dump(rows, f, indent=1)
        with open(os.path.join(OUT_DIR, "results.md"), "w") as f:
            f.write(markdown(rows))
    print(markdown(ran))
    return 1 if any(r.get("failed") or r.get("error") for r in ran) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
