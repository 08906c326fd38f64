"""Run the CPU suite against several vLLM releases in one environment; record the results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import docs_tables  # scripts/ is on sys.path when this file runs as a script
import junit_summary

from vllm_rocm_aiter_plugin.diagnostics import child

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "compat")
JUNIT_DIR = os.path.join(ROOT, "build", "compat")
RESULTS = os.path.join(OUT_DIR, "results.json")
OUTPUTS = ("compat/results.json", "docs/releases.md")
"""What a run writes into the tree."""

PROBE = (
    "from vllm_rocm_aiter_plugin.diagnostics import child\n"
    "from vllm_rocm_aiter_plugin.diagnostics.probe import probe_stock_split, probe_stock_v2_order\n"
    "import torch, vllm\n"
    "r, v2 = probe_stock_split(), probe_stock_v2_order()\n"
    "child.report({'affected': 'yes' if r.affected else 'no',\n"
    "              'drops_context': 'yes' if v2.affected else 'no',\n"
    "              'installed': vllm.__version__, 'torch': torch.__version__})\n"
)
"""What the installed vLLM does, in a fresh process (the commands' child protocol)."""


def _counts(junit: str) -> dict[str, int]:
    c = junit_summary.counts(junit)
    return {"passed": c["passed"], "failed": c["failures"] + c["errors"], "skipped": c["skipped"]}


def _install(version: str) -> str | None:
    """Swap in vLLM ``version``; the error, or None."""
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-compile", "--no-deps", "--force-reinstall", f"vllm=={version}"],
        capture_output=True, text=True,
    )  # fmt: skip
    return None if install.returncode == 0 else "install failed: " + install.stderr.strip()[-300:]


def _junit(version: str, suffix: str = "") -> str:
    return os.path.join(JUNIT_DIR, f"junit-vllm-{version}{suffix}.xml")


def _pytest(junit: str, *tests: str) -> tuple[int, int]:
    """Run pytest in the tree with a JUnit report: (exit code, seconds)."""
    start = time.monotonic()
    tests_run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
         "-n", "2", "--dist", "loadfile", *(tests or ["-m", "not project"])],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return tests_run.returncode, round(time.monotonic() - start)


def commit() -> str | None:
    """The tree's commit (short), marked where the tree differs from it; None outside git."""
    head = subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    if head.returncode != 0:
        return None
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
         *(f":(exclude){output}" for output in OUTPUTS)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    return head.stdout.strip() + (" (modified)" if status.stdout.strip() else "")


def run_release(version: str) -> dict[str, object]:
    row: dict[str, object] = {"vllm": version, "commit": commit()}
    error = _install(version)
    if error:
        return {**row, "error": error}
    probe = child.run(["-c", PROBE], cwd=ROOT)
    if probe.result is None:
        return {**row, "error": "vLLM does not import: " + probe.output.strip()[-300:]}
    row.update(probe.result)
    junit = _junit(version)
    if os.path.exists(junit):
        os.remove(junit)
    code, row["seconds"] = _pytest(junit)
    if not os.path.exists(junit):
        return {**row, "error": f"pytest exited {code} without a report"}
    row.update(_counts(junit))
    if code not in (0, 1):
        row["error"] = f"pytest exited {code}"
    return row


def failed_tests(junit: str) -> list[str]:
    """pytest node ids of the tests that failed or errored in a JUnit report."""
    ids = []
    for classname, name, outcome, _ in junit_summary.outcomes(junit):
        if outcome not in ("failure", "error"):
            continue
        parts = classname.split(".")
        # the longest leading part that names a file: tests.test_x.TestY -> tests/test_x.py::TestY
        files = [i for i in range(1, len(parts) + 1) if _is_module(parts[:i])]
        cut = files[-1] if files else len(parts)
        path = os.path.join(*parts[:cut]) + ".py"
        ids.append("::".join([path, *parts[cut:], name]))
    return ids


def _is_module(parts: list[str]) -> bool:
    return os.path.isfile(os.path.join(ROOT, *parts) + ".py")


def rerun_failed(version: str, rows: dict[str, dict[str, object]]) -> dict[str, object]:
    row = dict(rows.get(version) or {"vllm": version})
    junit = _junit(version)
    if "passed" not in row or not os.path.exists(junit):
        return {**row, "error": f"no earlier full run of {version} to rerun"}
    tests = failed_tests(junit)
    if not tests:
        return row
    error = _install(version)
    if error:
        return {**row, "error": error}
    rerun_junit = _junit(version, "-rerun")
    code, seconds = _pytest(rerun_junit, *tests)
    if not os.path.exists(rerun_junit):
        return {**row, "error": f"the rerun's pytest exited {code} without a report"}
    again = _counts(rerun_junit)
    first = _counts(junit)
    return {
        **row,
        "passed": first["passed"] + again["passed"],
        "failed": again["failed"],
        "skipped": first["skipped"] + again["skipped"],
        "rerun": {
            "tests": len(tests),
            "failed": again["failed"],
            "seconds": seconds,
            "commit": commit(),
        },
    }


def _rows() -> dict[str, dict[str, object]]:
    """Every release's latest row: ``compat/results.json``, updated by the rows measured since."""
    rows: dict[str, dict[str, object]] = {}
    if os.path.exists(RESULTS):  # a partial run updates its rows and keeps the others
        with open(RESULTS) as f:
            rows = {str(r["vllm"]): r for r in json.load(f)}
    for name in os.listdir(JUNIT_DIR):
        if name.startswith("row-") and name.endswith(".json"):
            with open(os.path.join(JUNIT_DIR, name)) as f:
                row = json.load(f)
            rows[str(row["vllm"])] = row
    return rows


def main(versions: list[str]) -> int:
    """Each release's row goes to ``build/compat/row-VERSION.json`` as soon as it is measured;
    ``compat/results.json`` is rewritten once, at the end, with every row measured so far (so
    that the suite, whose docs test reads that file, sees one file during the whole run, and
    runs over disjoint releases, one after the other, merge)."""
    os.makedirs(OUT_DIR, exist_ok=True)
    os.makedirs(JUNIT_DIR, exist_ok=True)
    rerun = versions[:1] == ["--rerun-failed"]
    if rerun:
        versions = versions[1:]
    ran = []
    for version in versions:
        row = rerun_failed(version, _rows()) if rerun else run_release(version)
        ran.append(row)
        with open(os.path.join(JUNIT_DIR, f"row-{version}.json"), "w") as f:
            json.dump(row, f)
        print(json.dumps(row), flush=True)
    rows = _rows()
    ordered = sorted(rows.values(), key=lambda r: tuple(map(int, str(r["vllm"]).split("."))))
    with open(RESULTS, "w") as f:
        json.dump(ordered, f, indent=1)
    docs_tables.main([])
    print(docs_tables.releases_table())
    print("compat: wrote compat/results.json and its table in docs/releases.md")
    return 1 if any(r.get("failed") or r.get("error") for r in ran) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
