"""The installed vLLM as the tests need it: its release, and what a probe can only find in a
process of its own. What a release does comes from ``diagnostics.probe``, run here: no list."""

from __future__ import annotations

import functools

import torch
import vllm

from vllm_rocm_aiter_plugin import releases


def release() -> str:
    """The installed vLLM's release, without local or dev suffixes."""
    return vllm.__version__.split("+")[0].split(".dev")[0]


TABLE = (releases.OLDEST, releases.NEWEST)  # the tested range, inclusive


@functools.cache
def merge_makes_nan_of_empty_states() -> bool:
    """``probe.release_facts``'s merge probe where vLLM's merge runs as the forward runs it: on the
    GPU, else in a fresh process under Triton's interpreter."""
    from tests.helpers.subprocess_util import run_child
    from vllm_rocm_aiter_plugin.diagnostics.forward.runner import child_env

    device = "cuda" if torch.cuda.is_available() else "cpu"
    code = "import torch\nfrom vllm_rocm_aiter_plugin.diagnostics import probe\n"
    code += f"report(probe.release_facts(torch.device({device!r})).merge_nan)\n"
    return bool(run_child(code, env=child_env(device)).result)


def compile_identity(config: object) -> object:
    """What vLLM's compile cache keys a config by: ``compute_hash()`` up to 0.33.0,
    ``compile_factors()`` from 0.34.0 (which removed ``compute_hash``)."""
    for name in ("compute_hash", "compile_factors"):
        method = getattr(config, name, None)
        if method is not None:
            return repr(method())
    raise AttributeError(f"{type(config).__name__} has neither compute_hash nor compile_factors")
