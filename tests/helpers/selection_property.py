"""The selection property, run in an emulated ROCm child process by
``tests/commands/test_backend_selection.py`` (:func:`machine`).
"""

from __future__ import annotations

import functools
import logging
import os
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.helpers.depth import examples

HEAD_SIZES = (32, 64, 80, 96, 112, 128, 192, 256, 512, 576)
BLOCK_SIZES = (None, 1, 8, 16, 32, 64, 128, 256)
JUNK = ("auto", "", "bogus", "rocm_aiter_fa ", "FLASH_ATTN_VLLM_V1")
# Half the draws come from what ROCm operators serve, so that most layers have backends to pick
SERVED_HEAD_SIZES = (64, 128, 256)
SERVED_BLOCK_SIZES = (None, 16, 32)
SERVED_KV_DTYPES = ("auto", "fp8", "bfloat16")


def half_served(served, every):
    """Draws from ``served`` half the time, from ``every`` otherwise."""
    from hypothesis import strategies as st

    return st.one_of(st.sampled_from(served), st.sampled_from(every))


def names() -> list[str]:
    """Every name this vLLM knows, the legacy names, and a few that are no backend at all."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_aiter_plugin.env_backend import LEGACY_NAMES

    return [*AttentionBackendEnum.__members__, *LEGACY_NAMES, *JUNK]


def rocm_names() -> list[str]:
    """The names this vLLM's ROCm selection offers for some layer, ROCM_AITER_FA, and the names
    of backends it never offers that ROCm launch scripts set."""
    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import rocm_candidate_names

    return [*rocm_candidate_names(), "ROCM_AITER_FA", "FLASH_ATTN", "ROCM_FLASH", "CPU_ATTN"]


def name_of(path: str) -> str:
    """The ``AttentionBackendEnum`` member whose class path (overrides included) is ``path``."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for member in AttentionBackendEnum:
        try:
            if member.get_path() == path:
                return member.name
        except ValueError:  # a placeholder member without a class
            continue
    return path


def kinds() -> tuple[list[Any], list[str]]:
    """``backend_choice.KINDS`` this release can describe, and the labels of those it cannot (a
    field or a cache dtype it lacks)."""
    import typing

    from vllm.config.cache import CacheDType
    from vllm.v1.attention.selector import AttentionSelectorConfig

    from vllm_rocm_aiter_plugin.diagnostics.backend_choice import KINDS

    cache_dtypes = set(typing.get_args(CacheDType))
    fields = set(AttentionSelectorConfig._fields) | {"kv_cache_dtype", "head_size"}
    usable, missing = [], []
    for kind in KINDS:
        ok = set(kind.fields) <= fields
        ok = ok and kind.run_kv_cache_dtype in (None, *cache_dtypes)
        (usable if ok else missing).append(kind if ok else kind.label)
    return usable, missing


class PluginLog(logging.Handler):
    """The plugin's log records from now on, its INFO lines too, whatever vLLM's level."""

    def __init__(self) -> None:
        from vllm_rocm_aiter_plugin.log import LOGGER_NAME

        super().__init__()
        self.records: list[logging.LogRecord] = []
        logging.getLogger(LOGGER_NAME).addHandler(self)
        logging.getLogger(LOGGER_NAME).setLevel(logging.INFO)

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def lines(self) -> list[tuple[str, str]]:
        return [(r.levelname, r.getMessage()) for r in self.records]


@functools.cache
def _aiter_root() -> Path | None:
    """``aiter_triton.aiter_root``, looked up once per process (every draw constructs)."""
    from tests.helpers.aiter_triton import aiter_root

    return aiter_root()


def constructs(load_backend: Callable[[], Any], layer: Any, aiter: bool) -> str | None:
    """None where the impl of the backend class ``load_backend()`` returns constructs for ``layer``
    (loading and constructing with AITER's package as on ROCm where the machine has ``aiter``),
    else why not."""
    import contextlib

    from tests.helpers.aiter_triton import loading

    root = _aiter_root()
    try:
        with loading(root) if aiter and root else contextlib.nullcontext():
            construct_impl(load_backend(), layer)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def construct_impl(backend_cls: Any, layer: Any) -> None:
    """Build ``backend_cls``'s impl for ``layer`` as an attention layer would (MLA's extra
    arguments included), raising what its constructor raises."""
    import inspect

    import torch

    impl_cls = backend_cls.get_impl_cls()
    heads = 8
    values: dict[str, Any] = {
        "num_heads": heads, "head_size": layer.head_size, "scale": layer.head_size**-0.5,
        "num_kv_heads": 1 if layer.use_mla else 2, "alibi_slopes": None,
        "sliding_window": 64 if getattr(layer, "has_sliding_window", False) else None,
        "kv_cache_dtype": layer.kv_cache_dtype or "auto", "logits_soft_cap": None,
        "attn_type": layer.attn_type, "kv_sharing_target_layer_name": None,
    }  # fmt: skip
    if layer.has_sink:
        values["sinks"] = torch.zeros(heads)
    if layer.use_mla:
        values.update(
            q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
            qk_head_dim=192, v_head_dim=128, indexer=None,
            kv_b_proj=torch.nn.Linear(512, heads * 256, bias=False),
        )  # fmt: skip
    parameters = inspect.signature(impl_cls.__init__).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    impl_cls(**{k: v for k, v in values.items() if takes_any or k in parameters})


EXAMPLES = 1500
"""Hypothesis examples per machine in a deep run (``tests/helpers/depth.py``)."""
SCENARIO_MACHINES = (("gfx942", False), ("gfx90a", True), ("gfx1100", True), ("gfx942", True))
"""Where the reported defects are checked too (``selection_scenarios``): AITER missing, or present
on GPUs it does not support; and the MI300 control, where it is."""


def machine(arch: str, aiter: bool) -> dict[str, Any]:
    """Everything the selection tests ask of one emulated machine, in its child process."""
    from vllm.platforms import current_platform

    from tests.helpers import selection_scenarios
    from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

    assert isinstance(current_platform, AiterRocmPlatform), type(current_platform)
    found = {"property": main(arch, aiter)}
    if (arch, aiter) in SCENARIO_MACHINES:
        found["scenarios"] = selection_scenarios.facts(arch, aiter)
    return found


def main(arch: str, aiter: bool) -> dict[str, Any]:
    import torch
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from vllm.config import set_current_vllm_config
    from vllm.platforms.rocm import RocmPlatform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_aiter_plugin import env_backend
    from vllm_rocm_aiter_plugin.diagnostics import backend_choice, samples
    from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

    lines = PluginLog()
    from vllm._aiter_ops import is_aiter_found_and_supported

    aiter_supported = is_aiter_found_and_supported()
    usable, missing = kinds()
    configs: dict[tuple[bool, str], Any] = {}
    capability = RocmPlatform.get_device_capability()
    counts: Counter[str] = Counter()

    def config(encoder_decoder: bool, cache: str) -> Any:
        if (encoder_decoder, cache) not in configs:
            configs[encoder_decoder, cache] = samples.tiny_vllm_config(
                encoder_decoder=encoder_decoder, cache_dtype=cache
            )
        return configs[encoder_decoder, cache]

    def outcome(call: Any) -> str:
        try:
            return call()
        except Exception as exc:
            return f"raises {type(exc).__name__}"

    def constructs_here(path: str, layer: Any) -> str | None:
        return constructs(lambda: resolve_obj_by_qualname(path), layer, aiter)

    import typing

    from vllm.config.cache import CacheDType

    kv_dtypes = [None, *typing.get_args(CacheDType)]

    @settings(max_examples=examples(EXAMPLES), database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(
        name=half_served(rocm_names(), names()),
        kind=st.sampled_from(usable),
        head_size=half_served(SERVED_HEAD_SIZES, HEAD_SIZES),
        dtype=half_served(
            [torch.bfloat16, torch.float16], [torch.float16, torch.bfloat16, torch.float32]
        ),
        kv_cache_dtype=half_served(SERVED_KV_DTYPES, kv_dtypes),
        block_size=half_served(SERVED_BLOCK_SIZES, BLOCK_SIZES),
    )
    def property_holds(name, kind, head_size, dtype, kv_cache_dtype, block_size):
        layer = backend_choice.selector(
            kind, kind.fields.get("head_size", head_size), dtype, kv_cache_dtype, block_size
        )
        encoder_decoder, run_cache = kind.encoder_decoder_model, kind.run_kv_cache_dtype
        os.environ[env_backend.ENV_VAR] = name
        env_backend._said.clear()  # each draw is a fresh process's first selection
        lines.records.clear()
        with set_current_vllm_config(config(encoder_decoder, run_cache or "auto")):
            stock = outcome(lambda: RocmPlatform.get_attn_backend_cls(None, layer))
            plugin = outcome(lambda: AiterRocmPlatform.get_attn_backend_cls(None, layer))
            valid, _invalid = RocmPlatform.get_valid_backends(capability, layer)
            allowed = {backend.get_path() for backend, _ in valid}
            if not stock.startswith("raises"):
                allowed.add(stock)
            if aiter_supported:
                allowed.add(AttentionBackendEnum.ROCM_AITER_FA.get_path())
            if stock.startswith("raises") and plugin not in allowed:  # ROCM_AITER_FA may serve
                assert plugin == stock, f"stock {stock}, plugin {plugin}"
                counts["stock raises"] += 1
                return
            assert not plugin.startswith("raises"), f"plugin {plugin} where stock gives {stock}"
            assert plugin in allowed, f"plugin picks {plugin}; stock allows {sorted(allowed)}"
            got = name_of(plugin)
            why = constructs_here(plugin, layer)
            if why is not None:
                assert plugin == stock or constructs_here(stock, layer) is not None, (
                    f"the plugin's pick {plugin} does not construct ({why}); stock's {stock} does"
                )
                counts[f"{got}: does not construct here, nor does stock's pick"] += 1
            for record in lines.records:
                text = record.getMessage()
                if record.levelno == logging.INFO:
                    assert text.startswith(f"Attention backend {got} selected"), text
                elif "is not honoured" in text:
                    assert text.endswith(f"Stock's automatic selection applies: {got}."), text
        requested = env_backend.resolve(name).value
        counts[
            "honoured" if requested is not None and got == requested.name else "stock's pick"
        ] += 1

    report: dict[str, Any] = {
        "arch": arch, "aiter": aiter, "aiter_supported": aiter_supported,
        "kinds": len(usable), "kinds_not_on_this_release": missing,
    }  # fmt: skip
    try:
        property_holds()
    except Exception as exc:
        report["failure"] = "".join(traceback.format_exception(exc))[-6000:]
    report["counts"] = dict(counts)
    try:
        report["doctor"] = doctor_agrees(names())
    except Exception as exc:  # reported as a disagreement, with its cause
        report["doctor"] = [f"the doctor's check failed: {type(exc).__name__}: {exc}"]
    return report


def doctor_agrees(every: list[str]) -> list[str]:
    """For every name that selects a backend: the doctor's PROBLEM / NOTE / nothing against the
    plugin platform's own picks on the doctor's kinds; the disagreements."""
    import torch
    from vllm.config import set_current_vllm_config

    from vllm_rocm_aiter_plugin.diagnostics import backend_choice
    from vllm_rocm_aiter_plugin.env_backend import ENV_VAR, resolve
    from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

    configs = backend_choice.model_configs()
    wrong = []
    for name in every:
        reading = resolve(name)
        if reading.value is None:
            continue
        os.environ[ENV_VAR] = name
        honoured = []
        for kind in backend_choice.DOCTOR_KINDS:
            layer = backend_choice.selector(
                kind, kind.fields.get("head_size", 128), torch.bfloat16, "auto", None
            )
            with set_current_vllm_config(configs[kind.encoder_decoder_model]):
                try:
                    path = AiterRocmPlatform.get_attn_backend_cls(None, layer)
                except ValueError:
                    continue
            honoured.append(name_of(path) == reading.value.name)
        judged, note = backend_choice.variable_reading(name, 128, "auto", None)
        expected = "nothing" if all(honoured) else "PROBLEM" if not any(honoured) else "NOTE"
        said = "PROBLEM" if judged.problem else "NOTE" if note else "nothing"
        exit_code = 1 if judged.problem else 0  # a PROBLEM line is an exit 1 (the doctor's tests)
        if said != expected or exit_code != (expected == "PROBLEM"):
            wrong.append(f"{name}: the doctor says {said}, the selection honours {honoured}")
    return wrong
