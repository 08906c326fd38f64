"""Run the CPU suite against several vLLM releases in one environment; record the results.

Usage (inside an environment built by ``noxfile.py``; ``bash scripts/nox -s compat`` does it all,
for every release in ``vllm_rocm_aiter_plugin/releases.py``):
    python scripts/compat.py VERSION [VERSION ...]

For each release: swap vLLM with ``pip install --no-deps --force-reinstall`` (torch and the pinned
dependencies stay), probe the stock split (does it crash on an EAGLE pure-decode batch, does it
drop context in model-runner V2 order), run the whole CPU suite (the forward tier included) with a
JUnit report, and record the counts. Writes ``compat/results.json`` (a partial rerun updates its
rows and keeps the others); ``bash scripts/nox -s docs`` puts the table into ``docs/releases.md``.
Exits non-zero if any release failed.
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
    """Each release's row goes to ``build/compat/row-VERSION.json`` as soon as it is measured;
    ``compat/results.json`` is rewritten once, at the end, with every row measured so far (so
    that the suite, whose docs test reads that file, sees one file during the whole run, and two
    runs over disjoint releases in two environments merge)."""
    os.makedirs(OUT_DIR, exist_ok=True)
    os.makedirs(JUNIT_DIR, exist_ok=True)
    ran = []
    for version in versions:
        row = run_release(version)
        ran.append(row)
        with open(os.path.join(JUNIT_DIR, f"row-{version}.json"), "w") as f:
            json.dump(row, f)
        print(json.dumps(row), flush=True)
    results_path = os.path.join(OUT_DIR, "results.json")
    rows: dict[str, dict[str, object]] = {}
    if os.path.exists(results_path):  # a partial rerun updates its rows and keeps the others
        with open(results_path) as f:
            rows = {str(r["vllm"]): r for r in json.load(f)}
    for name in os.listdir(JUNIT_DIR):
        if name.startswith("row-") and name.endswith(".json"):
            with open(os.path.join(JUNIT_DIR, name)) as f:
                row = json.load(f)
            rows[str(row["vllm"])] = row
    ordered = sorted(rows.values(), key=lambda r: tuple(map(int, str(r["vllm"]).split("."))))
    with open(results_path, "w") as f:
        json.dump(ordered, f, indent=1)
    print(markdown(ran))
    print("compat: wrote compat/results.json; `bash scripts/nox -s docs` updates docs/releases.md")
    return 1 if any(r.get("failed") or r.get("error") for r in ran) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
