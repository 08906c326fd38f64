"""How many requests stock vLLM's split serves without their cached context, counted where the
metadata is built: once per step, on tensor-parallel rank 0 of the first pipeline stage, never
while a CUDA graph is captured. Said in the log at vLLM's stats cadence and at exit, and then
handed to ``/metrics`` through a file the API server's stat logger reads (:mod:`.metrics`): the
metrics equal the log's totals. :func:`totals` returns them in process (``LLM.collective_rpc``).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import multiprocessing.util
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from vllm_rocm_aiter_plugin.envs import EXPOSURE_DIR as CHANNEL
from vllm_rocm_aiter_plugin.log import logger

if TYPE_CHECKING:
    from vllm_rocm_aiter_plugin.split import BatchSplit


@dataclass
class Totals:
    """Since this process started: request-steps stock serves without their context, the steps
    they were in, and the cached tokens they would not attend; ``observed``: whether stock served
    them so (observe mode) rather than the plugin with their context."""

    request_steps: int = 0
    steps: int = 0
    context_tokens: int = 0
    observed: bool = False


_lock = threading.Lock()
_totals = Totals()
_last_step: tuple[bytes, bytes] | None = None
_latest: tuple[int, int] = (0, 0)  # the last counted step's requests and tokens
_last_said = 0.0  # the monotonic time of the last log line
_timer: threading.Timer | None = None
_exit_finalizer_pid: int | None = None  # the process whose exit says a pending line
_capturing = threading.local()
_rank_counts: bool | None = None


def totals() -> dict[str, Any]:
    """This process's totals (a JSON-able dict)."""
    with _lock:
        return asdict(_totals)


def new_step() -> None:
    """The next build counts as a step of its own even with the last one's lengths (the doctor's
    forward check serves one step through several backends)."""
    global _last_step
    with _lock:
        _last_step = None


@contextlib.contextmanager
def not_counted() -> Iterator[None]:
    """Builds in this block are not steps (a CUDA graph's capture)."""
    _capturing.active = True
    try:
        yield
    finally:
        _capturing.active = False


def record(split: BatchSplit, observed: bool, engine: int = 0) -> None:
    """Count ``split``'s exposed rows, once per step (a step built again for another KV-cache
    group or for the drafter has the same lengths); ``engine``: the data-parallel rank."""
    if not split.exposed_requests or getattr(_capturing, "active", False) or not _counting_rank():
        return
    assert split.query_lens is not None and split.seq_lens is not None  # set on every mixed step
    step = (split.query_lens.tobytes(), split.seq_lens.numpy().tobytes())
    global _last_step, _latest
    with _lock:
        if step == _last_step:
            return
        _last_step, _latest = step, (split.exposed_requests, split.exposed_context_tokens)
        _totals.request_steps += split.exposed_requests
        _totals.steps += 1
        _totals.context_tokens += split.exposed_context_tokens
        _totals.observed = observed
    _say_later(engine)


def _counting_rank() -> bool:
    """Tensor-parallel rank 0 of the first pipeline stage (every rank builds the same metadata);
    any process without vLLM's parallel groups (a single process, the doctor, the tests)."""
    global _rank_counts
    if _rank_counts is not None:
        return _rank_counts
    try:
        from vllm.distributed import parallel_state as ps

        if not ps.model_parallel_is_initialized():
            return True
        _rank_counts = ps.get_tensor_model_parallel_rank() == 0 and ps.get_pp_group().is_first_rank
    except Exception:  # another release's parallel state: count rather than stay silent
        _rank_counts = True
    return _rank_counts


def channel_file(engine: int) -> str | None:
    """Where engine ``engine``'s counting process writes its totals; None without a channel."""
    folder = os.environ.get(CHANNEL)
    return os.path.join(folder, f"engine-{engine}.json") if folder else None


def open_channel() -> None:
    """In the first process that loads the plugin: a folder for the totals, named in the
    environment its children inherit (kept where a parent set it); removed when it exits."""
    if os.environ.get(CHANNEL):
        return
    try:
        folder = tempfile.mkdtemp(prefix="vllm-rocm-aiter-plugin-")
    except OSError as exc:  # no writable temporary folder: the log still counts, /metrics not
        logger().warning("exposure counts will not reach /metrics: %s", exc)
        return
    os.environ[CHANNEL] = folder
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # after its children


def _publish(counted: dict[str, Any], engine: int) -> None:
    path = channel_file(engine)
    if path is None:
        return
    try:
        with tempfile.NamedTemporaryFile("w", dir=os.path.dirname(path), delete=False) as f:
            json.dump(counted, f)
        os.replace(f.name, path)
    except OSError as exc:  # the folder went away: /metrics falls behind, the log does not
        logger().debug("exposure totals not written to %s: %s", path, exc)


@functools.cache
def _interval() -> float:
    """vLLM's stats log interval, read once."""
    try:
        import vllm.envs as vllm_envs

        return float(vllm_envs.VLLM_LOG_STATS_INTERVAL)
    except Exception:
        return 10.0


def _say_later(engine: int) -> None:
    """The log line now if vLLM's stats interval has passed since the last one, else once at its
    end (with the totals then): at most one line per interval, none without a new count."""
    global _timer, _last_said
    with _lock:
        wait = _last_said + _interval() - time.monotonic()
        if wait > 0:
            if _timer is None:
                _timer = threading.Timer(wait, _say, args=(engine,))
                _timer.daemon = True
                _timer.start()
                _say_pending_at_exit()
            return
        _last_said = time.monotonic()
    _say(engine)


def _say_pending_at_exit() -> None:
    """Have this process say a pending line when it exits (its last interval's counts would be
    lost with the daemon timer): through multiprocessing's exit finalizers, which run in the main
    process and in vLLM's engine and worker processes, forked or spawned (a forked child runs no
    ``atexit`` hook and starts with no finalizer of its parent's)."""
    global _exit_finalizer_pid
    if _exit_finalizer_pid != os.getpid():
        _exit_finalizer_pid = os.getpid()
        multiprocessing.util.Finalize(None, _say_pending, exitpriority=0)


def _say_pending() -> None:
    with _lock:
        pending = _timer
    if pending is not None:
        pending.cancel()
        _say(*pending.args)


def _say(engine: int) -> None:
    """The log line, and the same totals written for ``/metrics``."""
    global _timer, _last_said
    with _lock:
        _timer, _last_said = None, time.monotonic()
        now, (requests, tokens) = Totals(**asdict(_totals)), _latest
    _publish(asdict(now), engine)
    since = (
        f"Since start: {now.request_steps} request-steps in {now.steps} steps, "
        f"{now.context_tokens} cached tokens."
    )
    if now.observed:
        logger().warning(
            "ROCM_AITER_FA served %d request(s) of a step without their %d cached tokens, as "
            "stock vLLM does (VLLM_ROCM_AITER_PLUGIN=observe). %s Unset VLLM_ROCM_AITER_PLUGIN to "
            "serve them with their context.",
            requests,
            tokens,
            since,
        )
    else:
        logger().info(
            "ROCM_AITER_FA: %d request(s) of a step that stock vLLM would serve without their %d "
            "cached tokens; the plugin served them with their context. %s",
            requests,
            tokens,
            since,
        )
