"""Print a JUnit XML file's counts as one line and keep a copy (used by nox and .ci/run)."""

from __future__ import annotations

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


def main(argv: list[str]) -> int:
    if argv[0] == "--total":
        sums = {"passed": 0, "failed": 0, "skipped": 0}
        for path in argv[1:]:
            c = counts(path)
            sums["passed"] += c["passed"]
            sums["failed"] += c["failures"] + c["errors"]
            sums["skipped"] += c["skipped"]
        print(f"total: {sums['passed']} passed, {sums['failed']} failed, {sums['skipped']} skipped")
        return 1 if sums["failed"] else 0
    source, copy = argv
    c = counts(source)
    shutil.copyfile(source, copy)
    print(
        f"{copy}: {c['passed']} passed, {c['failures'] + c['errors']} failed, {c['skipped']} skipped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
