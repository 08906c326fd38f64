"""Prove a job left an image's packages as they were: ``python3 scripts/image_packages.py record
FILE`` hashes every installed file of every distribution (``check_installed.file_hashes``: the
files each RECORD lists, bytecode aside); ``compare FILE [--except NAME...]`` hashes them again
and exits 1 naming each distribution whose files changed, appeared or went. Standard library only:
it runs on the image's own Python before anything is installed (rocm.yml).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from check_installed import file_hashes

SHOWN = ("vllm", "torch", "aiter", "amd-aiter", "triton")
"""The distributions whose versions the record step prints, for the job's log."""


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def snapshot() -> dict[str, dict[str, str]]:
    names = sorted({(d.metadata["Name"] or "").lower() for d in importlib.metadata.distributions()})
    return {name: file_hashes(name) for name in names if name}


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("record", "compare"):
        print(__doc__, file=sys.stderr)
        return 2
    command, path, *rest = argv
    now = snapshot()
    if command == "record":
        with open(path, "w") as f:
            json.dump(now, f, indent=0, sort_keys=True)
        files = sum(map(len, now.values()))
        print(f"image_packages: {len(now)} distributions, {files} files recorded in {path}")
        shown = ", ".join(f"{n} {_version(n)}" for n in SHOWN)
        print(f"image_packages: Python {sys.version.split()[0]}; {shown}")
        return 0
    excepted = {name.lower() for name in rest if name != "--except"}
    with open(path) as f:
        before = json.load(f)
    changed = sorted(
        name
        for name in (before.keys() | now.keys()) - excepted
        if before.get(name) != now.get(name)
    )
    for name in changed:
        print(f"image_packages: CHANGED {name}")
    print(
        f"image_packages: {len(before)} distributions before, {len(now)} after; "
        f"{len(changed)} changed (not counted: {', '.join(sorted(excepted)) or 'none'})"
    )
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
