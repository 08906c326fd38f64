"""Run a command, time it, and record the time in benchmarks/results/timings.json, from which the
README's and docs/testing.md's figures are generated (their cog blocks call :func:`sentence` and
:func:`table`).

  python scripts/timed.py NAME -- COMMAND [ARG...]

A later run of the same NAME replaces its record; a failed command is not recorded.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD = os.path.abspath(
    os.environ.get("TIMED_RECORD") or os.path.join(ROOT, "benchmarks", "results", "timings.json")
)
"""The record; ``TIMED_RECORD`` puts it elsewhere (``.ci/run``: under ``build/``, so that the
checkout's docs and record stay in step while CI runs)."""
TIMINGS = {
    "demo-first": "the demo's first run in a fresh clone (it builds its environment)",
    "demo-again": "the demo run again (nothing changed: no wheel built)",
    "tests": "the test command, environments included",
    "ci": "`CI=true bash .ci/run` in a fresh clone",
    "doctor": "`python -m vllm_rocm_aiter_plugin doctor --json`",
    "doctor-fp8": "`python -m vllm_rocm_aiter_plugin doctor --json --kv-cache-dtype fp8`",
}


def machine() -> str:
    """``2 cores, 24 GiB, no GPU``: what the time was measured on."""
    memory = "?"
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
        memory = f"{round(kib / 2**20)} GiB"
    except (OSError, StopIteration, ValueError):
        pass
    gpu = (
        "an AMD GPU"
        if os.path.exists("/dev/kfd")
        else "an NVIDIA GPU"
        if os.path.exists("/dev/nvidia0")
        else "no GPU"
    )
    return f"{os.cpu_count()} cores, {memory}, {gpu}"


def commit(cwd: str) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git(
        "status", "--porcelain", "--untracked-files=no", "--", ".",
        f":!{os.path.relpath(RECORD, cwd)}",
    )  # fmt: skip
    return head + ("-modified" if changed else "")


def shown(command: list[str], cwd: str = ROOT) -> str:
    """``command`` as a reader would type it: a path inside the checkout relative to it, any other
    absolute path a ``<placeholder>`` (this machine's paths stay out of the record)."""

    def path(match: re.Match[str]) -> str:
        found = match.group(0)
        inside = os.path.relpath(found, cwd)
        return inside if not inside.startswith("..") else f"<{os.path.basename(found) or 'dir'}>"

    return re.sub(r"(?<![\w.<])/[^\s'\"<>]+", path, " ".join(command))


def _records() -> list[dict]:
    with open(os.path.join(ROOT, "benchmarks", "results", "timings.json")) as f:
        return json.load(f)


def _took(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def sentence() -> str:
    """The README's figures, each from its record, with the date(s) and the machine(s)."""
    records = {r["name"]: r for r in _records()}
    parts = {
        "demo-first": "the demo's first run in a fresh clone took {} (its environment built)",
        "demo-again": "a later run {} (no wheel built)",
        "tests": "the test command {}",
        "ci": "a fresh clone's CI (`.ci/run`) {}",
        "doctor": "the doctor {}",
        "doctor-fp8": "with `--kv-cache-dtype fp8` {}",
    }
    said = [text.format(_took(records[n]["seconds"])) for n, text in parts.items() if n in records]
    where = sorted({f"{r['date']}, {r['machine']}" for r in records.values()})
    return f"- Measured ({'; '.join(where)}): {', '.join(said)}."


def table() -> str:
    """``docs/testing.md``'s table of every record."""
    lines = ["| what | took | date | machine | commit | command |", "|---|---:|---|---|---|---|"]
    lines += [
        f"| {TIMINGS[r['name']]} | {_took(r['seconds'])} ({r['seconds']} s) | {r['date']} "
        f"| {r['machine']} | {r['commit']} | `{r['command']}` |"
        for r in _records()
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in TIMINGS or argv[1] != "--":
        print(__doc__.strip() + "\nNAME: " + ", ".join(TIMINGS), file=sys.stderr)
        return 2
    name, command = argv[0], argv[2:]
    measured = commit(ROOT)  # the tree as the command found it, not as it is when it ends
    start = time.monotonic()
    code = subprocess.run(command).returncode
    seconds = round(time.monotonic() - start, 1)
    if code != 0:
        print(f"timed: {name} exited {code}; not recorded", file=sys.stderr)
        return code
    records = []
    if os.path.exists(RECORD):
        with open(RECORD) as f:
            records = [r for r in json.load(f) if r["name"] != name]
    records.append({
        "name": name, "seconds": seconds, "date": datetime.date.today().isoformat(),
        "machine": machine(), "commit": measured, "command": shown(command),
    })  # fmt: skip
    records.sort(key=lambda r: list(TIMINGS).index(r["name"]))
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    with open(RECORD, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")
    print(
        f"timed: {name} took {seconds} s; recorded in {os.path.relpath(RECORD, ROOT)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
