"""Counts and outcomes of JUnit XML reports (used by scripts/nox, .ci/run, compat, upstream_check)."""

from __future__ import annotations

import os
import re
import shutil
import sys
import xml.etree.ElementTree as ET


def counts(path: str) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        for key in total:
            total[key] += int(suite.get(key, 0))
    total["passed"] = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    return total


def outcomes(path: str) -> list[tuple[str, str, str, str]]:
    """Each test case of a report: (classname, name, outcome, message); the outcome is passed,
    failure, error or skipped."""
    rows = []
    for case in ET.parse(path).getroot().iter("testcase"):
        result = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        outcome, message = ("passed", "") if result is None else (result.tag, result.get("message"))
        rows.append((case.get("classname", ""), case.get("name", ""), outcome, message or ""))
    return rows


def _line(c: dict[str, int]) -> str:
    return f"{c['passed']} passed, {c['failures'] + c['errors']} failed, {c['skipped']} skipped"


def _label(path: str) -> str:
    match = re.match(r"junit-vllm-(.+?)(-partial)?\.xml$", os.path.basename(path))
    if match is None:
        return path
    return f"vLLM {match.group(1)}" + (" (partial run)" if match.group(2) else "")


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--each":
        sums = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "passed": 0}
        for path in sorted(argv[1:]):
            c = counts(path)
            print(f"{_label(path)}: {_line(c)}")
            for key in sums:
                sums[key] += c[key]
        print(f"total: {_line(sums)}")
        return 1 if sums["failures"] + sums["errors"] else 0
    source, copy = argv
    c = counts(source)
    shutil.copyfile(source, copy)
    print(f"{copy}: {_line(c)}")
    return 1 if c["failures"] + c["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
