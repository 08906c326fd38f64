"""The one protocol between the commands (and the tests) and the fresh Python processes they
start, of three kinds: a function run by its name (:func:`call`: the forward runner, the tests'
tiers), a code snippet (``run(["-c", code])``: the tests), and the command line itself
(``run(["-m", "vllm_rocm_aiter_plugin", ...])``). A request goes in as JSON on stdin; the result
comes back as the last marked line of stdout."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RESULT_MARK = "@@vllm-rocm-aiter-plugin@@"


def report(result: Any) -> None:
    """In the child: hand ``result`` (JSON-able) to the parent."""
    print(RESULT_MARK + json.dumps(result), flush=True)


def read_request() -> Any:
    """In the child: the JSON document the parent wrote to stdin."""
    return json.load(sys.stdin)


@dataclass
class ChildResult:
    returncode: int
    result: Any  # the last reported result; None if the child reported nothing
    output: str  # stdout (less the result lines) and stderr


@dataclass
class Started:
    process: subprocess.Popen[str]
    timeout: float


def load_scaled(seconds: float) -> float:
    """``seconds`` for an idle machine, stretched by how far the load average exceeds the cores."""
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load average on this platform
        return seconds
    return seconds * max(1.0, load / (os.cpu_count() or 1))


def start(
    args: Sequence[str],
    *,
    request: Any = None,
    env: Mapping[str, str | None] | None = None,
    cwd: str | None = None,
    timeout: float = 300,
) -> Started:
    """Start ``python ARGS`` with this process's environment changed by ``env`` (None removes a
    variable), ``request`` as JSON on its stdin; :func:`finish` waits for it."""
    environ = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    process = subprocess.Popen(
        [sys.executable, *args], cwd=cwd, env=environ, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, stdin=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None
    with process.stdin:
        if request is not None:
            process.stdin.write(json.dumps(request))
    process.stdin = None  # written and closed: communicate() sends nothing more
    return Started(process, load_scaled(timeout))


def finish(started: Started) -> ChildResult:
    """Wait for the child; its result. Raises ``TimeoutError`` past the (load-scaled) limit."""
    try:
        stdout, stderr = started.process.communicate(timeout=started.timeout)
    except subprocess.TimeoutExpired as exc:
        started.process.kill()
        started.process.communicate()
        try:
            load = f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
        except OSError:
            load = "load unknown"
        raise TimeoutError(
            f"a fresh Python process did not finish within {started.timeout:.0f} s ({load}); "
            "on a busy machine a rerun may pass"
        ) from exc
    result, kept = None, []
    for line in stdout.splitlines(keepends=True):
        if line.startswith(RESULT_MARK):
            result = json.loads(line[len(RESULT_MARK) :])
        else:
            kept.append(line)
    return ChildResult(started.process.returncode, result, "".join(kept) + stderr)


def run(args: Sequence[str], **options: Any) -> ChildResult:
    """:func:`start`, then :func:`finish`."""
    return finish(start(args, **options))


def call(target: str, request: Any = None, **options: Any) -> Started:
    """Start a fresh interpreter that runs ``target`` (``"package.module:function"``) on
    ``request`` and reports what it returns (JSON-able); :func:`finish` reads it."""
    return start(["-m", __name__], request={"target": target, "request": request}, **options)


def main() -> int:
    """In the child :func:`call` starts: run the target on the request, report its result."""
    job = read_request()
    module, name = job["target"].split(":")
    report(getattr(importlib.import_module(module), name)(job["request"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
