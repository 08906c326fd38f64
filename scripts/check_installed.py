"""What an operator's ``pip`` does with the plugin's wheel: ``python scripts/check_installed.py
WHEEL``.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DIST = "vllm-rocm-aiter-plugin"
PACKAGE = "vllm_rocm_aiter_plugin"
COMMAND = "vllm-rocm-aiter-plugin"
STOCK = "vllm.v1.attention.backends.rocm_aiter_fa.AiterFlashAttentionBackend"
UNCHANGED = ("vllm", "torch")
"""The image's packages whose installed files must be byte for byte the same afterwards."""
CLEARED = ("VLLM_PLUGINS", "VLLM_ROCM_AITER_PLUGIN", "VLLM_ROCM_AITER_PLUGIN_OWN_BUILD",
           "VLLM_ATTENTION_BACKEND", "VLLM_ROCM_USE_AITER", "PYTHONPATH")  # fmt: skip

RESOLVE = (
    "from vllm.plugins import load_general_plugins\n"
    "load_general_plugins()\n"
    "from vllm.v1.attention.backends.registry import AttentionBackendEnum\n"
    "print(AttentionBackendEnum.ROCM_AITER_FA.get_path())\n"
)
WHERE = "import vllm_rocm_aiter_plugin as p, sysconfig; print(p.__file__)"


@dataclass
class Ran:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str


def file_hashes(distribution: str) -> dict[str, str]:
    """sha256 of every installed file the distribution's RECORD lists, bytecode aside."""
    dist = importlib.metadata.distribution(distribution)
    hashes = {}
    for file in dist.files or ():
        path = str(dist.locate_file(file))
        if path.endswith(".pyc") or not os.path.isfile(path):
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        hashes[str(file)] = digest.hexdigest()
    return hashes


def installed_distributions() -> dict[str, str]:
    return {
        dist.metadata["Name"].lower(): dist.version for dist in importlib.metadata.distributions()
    }


def run(argv: Sequence[str], cwd: str, **env: str) -> Ran:
    environ = {k: v for k, v in os.environ.items() if k not in CLEARED}
    environ.update(env)
    proc = subprocess.run(
        list(argv), cwd=cwd, env=environ, capture_output=True, text=True, timeout=1200,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    return Ran(list(argv), proc.returncode, proc.stdout, proc.stderr)


def pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", *args, "--quiet", "--disable-pip-version-check"],
        check=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def main(argv: list[str]) -> int:
    (wheel,) = argv
    outside = tempfile.mkdtemp(prefix="operator-")  # not the checkout, not under it
    command = os.path.join(sysconfig.get_path("scripts"), COMMAND)
    python = sys.executable
    results: list[tuple[str, bool, str]] = []

    def check(title: str, ok: bool, detail: str = "") -> None:
        results.append((title, ok, detail))
        print(f"installed: {'PASS' if ok else 'FAIL'}  {title}{f' ({detail})' if detail else ''}",
              flush=True)  # fmt: skip

    def expect(title: str, ran: Ran, predicate: Callable[[Ran], bool]) -> None:
        ok = predicate(ran)
        detail = f"exit {ran.returncode}, last line {last_line(ran.stdout)!r}"
        check(title, ok, detail)
        if not ok:
            print(f"--- stdout\n{ran.stdout[-3000:]}\n--- stderr\n{ran.stderr[-3000:]}", flush=True)

    try:
        importlib.metadata.distribution(DIST)
    except importlib.metadata.PackageNotFoundError:
        pass
    else:
        print(f"installed: {DIST} is already installed here; uninstall it first")
        return 2
    before_files = {name: file_hashes(name) for name in UNCHANGED}
    before_dists = installed_distributions()
    pip("install", "--no-deps", wheel)
    added = sorted(set(installed_distributions().items()) - set(before_dists.items()))
    check("pip install --no-deps WHEEL adds the plugin and nothing else", added == [
        (DIST, importlib.metadata.version(DIST))], f"added {added}")  # fmt: skip

    where = run([python, "-c", WHERE], outside)
    purelib = os.path.realpath(sysconfig.get_path("purelib"))
    check(
        "python imports the installed copy (site-packages)",
        os.path.realpath(where.stdout.strip()).startswith(purelib + os.sep),
        where.stdout.strip() or where.stderr[-300:],
    )
    expect(f"{COMMAND} --help (the console script): exit 0", run([command, "--help"], outside),
           lambda r: r.returncode == 0 and COMMAND in r.stdout)  # fmt: skip
    resolved = run([python, "-c", RESOLVE], outside)
    check("with the plugin, ROCM_AITER_FA resolves to the plugin",
          last_line(resolved.stdout).startswith(PACKAGE), last_line(resolved.stdout))  # fmt: skip

    pip("uninstall", "-y", DIST)
    after_dists = installed_distributions()
    check("pip uninstall leaves every other package as it was", after_dists == before_dists,
          f"changed {sorted(set(after_dists.items()) ^ set(before_dists.items()))}")  # fmt: skip
    for name, hashes in before_files.items():
        after = file_hashes(name)
        changed = sorted(f for f in hashes.keys() | after.keys() if hashes.get(f) != after.get(f))
        check(f"{name}'s {len(hashes)} installed files are byte for byte unchanged", not changed,
              f"changed: {changed[:5]}" if changed else "")  # fmt: skip
    leftovers = [p for p in (os.path.join(purelib, PACKAGE), command) if os.path.exists(p)]
    check("no file of the plugin is left", not leftovers, ", ".join(leftovers))
    resolved = run([python, "-c", RESOLVE], outside)
    resolves_to = last_line(resolved.stdout) or resolved.stderr[-300:]
    check("after the uninstall, ROCM_AITER_FA resolves to stock", resolves_to == STOCK, resolves_to)
    shutil.rmtree(outside, ignore_errors=True)

    failed = [title for title, ok, _ in results if not ok]
    print(f"installed: {len(failed)} of {len(results)} checks FAILED" if failed
          else f"installed: all {len(results)} checks hold")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
