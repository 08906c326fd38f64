"""Write the docs' result tables from the results files (never copied by hand)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import trace_tables  # noqa: E402 (stdlib only)

BLOCK = re.compile(r"(<!-- generated: (\S+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def _releases():
    path = os.path.join(ROOT, "src", "vllm_rocm_aiter_plugin", "releases.py")
    spec = importlib.util.spec_from_file_location("_releases", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load(relative: str) -> object:
    with open(os.path.join(ROOT, relative)) as f:
        return json.load(f)


def releases_table() -> str:
    facts = _releases()
    rows = _load("compat/results.json")
    assert isinstance(rows, list)
    lines = [
        "| vLLM | stock crashes on EAGLE decode (probed) | stock drops context in V2 order "
        "(probed) | merge of two empty states is NaN | passed | failed | skipped | seconds "
        "| measured at |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        nan = "yes" if r["vllm"] in facts.MERGE_NAN_OF_EMPTY_STATES else "no"
        if "passed" in r:
            lines.append(
                f"| {r['vllm']} | {r['affected']} | {r['drops_context']} | {nan} | {r['passed']} "
                f"| {r['failed']} | {r['skipped']} | {_seconds(r)} | {_commit(r)} |"
            )
        else:
            lines.append(
                f"| {r['vllm']} | - | - | {nan} | - | - | - | {r.get('error', '')} | {_commit(r)} |"
            )
    tested = sum(1 for r in rows if r["vllm"] in facts.TESTED)
    green = sum(
        1 for r in rows if r["vllm"] in facts.TESTED and r.get("passed") and not r["failed"]
    )
    recorded = sum(1 for r in rows if r["vllm"] in facts.TESTED and r.get("commit"))
    return "\n".join([*lines, "", f"Green: {green} of {len(facts.TESTED)} tested releases "
                      f"({tested} measured, {recorded} at a recorded commit)."])  # fmt: skip


def _commit(row: dict) -> str:
    """The commit a row's suite ran at (and its rerun's); rows measured before compat recorded
    it say so."""
    measured = row.get("commit") or "not recorded (an earlier, smaller suite)"
    rerun = (row.get("rerun") or {}).get("commit")
    return f"{measured}, rerun at {rerun}" if rerun else measured


def _seconds(row: dict) -> str:
    """The run's seconds, and a rerun of its failed tests (``compat.py --rerun-failed``) if any."""
    rerun = row.get("rerun")
    if not rerun:
        return str(row["seconds"])
    return f"{row['seconds']} + {rerun['seconds']} (rerun of {rerun['tests']} failed)"


def _cell(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(stock: float | None, plugin: float | None) -> str:
    return "-" if not stock or not plugin else f"{stock / plugin:.1f}x"


def bench_table() -> str:
    data = _load("benchmarks/results/bench.json")
    assert isinstance(data, dict)
    machine = data["machine"]
    lines = [
        f"vLLM {machine['vllm']}, torch {machine['torch']}, Python {machine['python']}, "
        f"{machine['cpu']}, {machine['cores']} cores, torch threads {machine['torch_threads']}; "
        "medians in µs, stock and plugin timed in alternating rounds; ratio = stock / plugin.",
        "",
        "| shape | reqs | tokens | split stock µs | split plugin µs | build stock µs | build plugin "
        "µs | build ratio | peak MB stock | peak MB plugin |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        stock_build = (
            r.get("build_stock_error") or _cell(r.get("build_stock_us"))
            if r.get("build_stock_us") or r.get("build_stock_error")
            else "skipped (>8 GB)"
        )
        stock_split = r.get("split_stock_error") or _cell(r.get("split_stock_us"), 2)
        stock_peak = r.get("stock_peak_bytes")
        plugin_peak = r.get("plugin_peak_bytes")
        lines.append(
            f"| {r['shape']} | {r['requests']} | {r['tokens']} | {stock_split} "
            f"| {_cell(r['split_plugin_us'], 2)} | {stock_build} | {_cell(r['build_plugin_us'])} "
            f"| {_ratio(r.get('build_stock_us'), r['build_plugin_us'])} "
            f"| {_cell(stock_peak / 1e6 if stock_peak else None, 2)} "
            f"| {_cell(plugin_peak / 1e6 if plugin_peak else None, 2)} |"
        )
    return "\n".join(lines)


def _trace() -> dict:
    data = _load("benchmarks/results/serving_trace.json")
    assert isinstance(data, dict)
    return data


def trace_table() -> str:
    data = _trace()
    return trace_tables.trace_table(data["rows"], data["machine"])


def trace_forward_table() -> str:
    return trace_tables.trace_forward_table(_trace()["rows"])


def upstream_releases_table() -> str:
    rows = _load("compat/results.json")
    assert isinstance(rows, list)
    lines = ["| vLLM | model runner V2 order drops context (probed) |", "|---|---|"]
    lines += [f"| {r['vllm']} | {r.get('drops_context', '-')} |" for r in rows]
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def variables_table() -> str:
    """``envs.VARIABLES``: name, whose it is, its values and what they do."""
    from vllm_rocm_aiter_plugin import envs

    lines = ["| variable | owner | values and effect |", "|---|---|---|"]
    lines += [f"| `{v.name}` | {v.owner} | {_md_cell(v.doc)} |" for v in envs.VARIABLES]
    return "\n".join(lines)


def _took(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def timings_sentence() -> str:
    """The README's figures, each from its record, with the date(s) and the machine(s)."""
    records = {r["name"]: r for r in _load("benchmarks/results/timings.json")}  # type: ignore[union-attr]
    parts = {
        "demo-first": "the demo's first run in a fresh clone took {} (its environment built)",
        "demo-again": "a later run {} (no wheel built)",
        "tests": "the test command {}",
        "ci": "a fresh clone's CI (`.ci/run`) {}",
        "doctor": "the doctor {}",
        "doctor-fp8": "with `--kv-cache-dtype fp8` {}",
    }
    said = [text.format(_took(records[n]["seconds"])) for n, text in parts.items() if n in records]
    if not said:
        return "- Not timed yet (`scripts/timed.py` records the times shown here)."
    where = sorted({f"{r['date']}, {r['machine']}" for r in records.values()})
    return f"- Measured ({'; '.join(where)}): {', '.join(said)}."


def timings_table() -> str:
    rows = _load("benchmarks/results/timings.json")
    assert isinstance(rows, list)
    lines = ["| what | took | date | machine | commit | command |", "|---|---:|---|---|---|---|"]
    timed = _script("timed.py")
    lines += [
        f"| {_md_cell(timed.TIMINGS[r['name']])} | {_took(r['seconds'])} ({r['seconds']} s) | "
        f"{r['date']} | {r['machine']} | {r['commit']} | `{_md_cell(r['command'])}` |"
        for r in rows
    ]
    return "\n".join(lines)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(ROOT, "scripts", name))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TABLES: dict[str, Callable[[], str]] = {
    "timings": timings_sentence,
    "timings-all": timings_table,
    "variables": variables_table,
    "releases": releases_table,
    "upstream-releases": upstream_releases_table,
    "bench": bench_table,
    "trace": trace_table,
    "trace-forward": trace_forward_table,
}


def render(text: str) -> str:
    def replace(match: re.Match[str]) -> str:
        return f"{match.group(1)}{TABLES[match.group(2)]()}\n{match.group(4)}"

    return BLOCK.sub(replace, text)


def main(argv: list[str]) -> int:
    check = argv == ["--check"]
    stale = []
    docs = sorted(
        os.path.relpath(os.path.join(folder, name), ROOT)
        for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
        for name in names
        if name.endswith(".md")
    )
    pages = ["README.md", *docs]
    for name in pages:
        path = os.path.join(ROOT, name)
        with open(path) as f:
            text = f.read()
        new = render(text)
        if new != text:
            stale.append(name)
            if not check:
                with open(path, "w") as f:
                    f.write(new)
    if check and stale:
        print(f"docs_tables: out of date: {', '.join(stale)}; run python scripts/docs_tables.py")
        return 1
    print(f"docs_tables: {'rewrote ' + ', '.join(stale) if stale else 'up to date'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
