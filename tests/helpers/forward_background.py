"""The forward tier's child, started as soon as collection ends so that it runs beside the other
tests (a core each on a 2-core machine) rather than after them; ``tests/test_forward.py``'s
fixture takes its report. The thread only waits on the child process: everything it calls is
imported here, in the main thread, before it starts."""

from __future__ import annotations

import threading
from typing import Any

from tests.helpers import forward_child

CONTROL_CASES = ("multi-chunk-v2", "64-prompts-v2", "v2-sinks")

_lock = threading.Lock()
_done = threading.Event()
_outcome: dict[str, Any] = {}
_thread: threading.Thread | None = None


def _run() -> None:
    try:
        _outcome["report"] = forward_child.run_in_child(
            scheduler_steps=True, control=CONTROL_CASES, graph_replays=True
        )
    except BaseException as exc:  # handed to the fixture, which raises it in the test
        _outcome["error"] = exc
    finally:
        _done.set()


def start() -> None:
    """Start the child once (a daemon thread: an interrupted run does not wait for it)."""
    global _thread
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_run, name="forward-tier", daemon=True)
            _thread.start()


def report() -> dict[str, Any]:
    start()
    _done.wait()
    if "error" in _outcome:
        raise _outcome["error"]
    return _outcome["report"]


def report_or_skip() -> dict[str, Any]:
    """The report; a skip, with its reason, where vLLM's forward cannot run in this process."""
    import pytest

    result = report()
    if "unavailable" in result:
        pytest.skip(result["unavailable"])
    return result
