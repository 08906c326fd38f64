"""Is there a vLLM release newer than the tested range? (The release watch's first step.)"""

from __future__ import annotations

import re
import subprocess
import sys

from vllm_rocm_aiter_plugin import policy


def newest_on_index() -> tuple[int, int, int] | None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "vllm"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    match = re.search(r"Available versions: ([^\n]+)", proc.stdout)
    if proc.returncode != 0 or match is None:
        return None
    versions = [policy.parse_version(v) for v in match.group(1).split(", ")]
    return max((v for v in versions if v is not None), default=None)


def main() -> int:
    newest = newest_on_index()
    tested = policy.format_version(policy.NEWEST_TESTED_VLLM)
    if newest is None:
        print("newer_vllm: could not read vLLM's versions from the package index", file=sys.stderr)
        return 2
    if newest <= policy.NEWEST_TESTED_VLLM:
        print(f"newer_vllm: the newest vLLM on the index is {policy.format_version(newest)}, "
              f"inside the tested range (newest tested {tested})")  # fmt: skip
        return 0
    print(f"newer_vllm: vLLM {policy.format_version(newest)} is newer than the tested range "
          f"(newest tested {tested})")  # fmt: skip
    print(policy.format_version(newest))
    return 1


if __name__ == "__main__":
    sys.exit(main())
