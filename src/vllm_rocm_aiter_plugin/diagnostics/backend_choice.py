"""What ``VLLM_ATTENTION_BACKEND`` gives each kind of attention layer here, for the doctor."""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass, field
from typing import Any

from vllm_rocm_aiter_plugin.envs import ATTENTION_BACKEND as ENV_VAR

PRIORITIES_FUNCTION = "_get_backend_priorities"
AITER_FA = "ROCM_AITER_FA"


@dataclass(frozen=True)
class LayerKind:
    """One kind of attention layer: ``AttentionSelectorConfig`` fields, whether the model is an
    encoder-decoder one (vLLM 0.33's ROCm selection reads that off the model's config), the KV
    cache dtype of the run it is served in (None: the layer's), and whether the doctor asks
    about it (the rarer kinds only the selection property draws)."""

    label: str
    fields: dict[str, Any] = field(default_factory=dict)
    encoder_decoder_model: bool = False
    run_kv_cache_dtype: str | None = None
    asked_by_doctor: bool = True


KINDS: tuple[LayerKind, ...] = (
    LayerKind("decoder layers"),
    LayerKind("sliding-window decoder layers", {"has_sliding_window": True}),
    LayerKind("decoder layers with attention sinks", {"has_sink": True}),
    LayerKind("MLA layers", {"use_mla": True, "head_size": 576}),
    LayerKind("sparse MLA layers", {"use_mla": True, "use_sparse": True, "head_size": 576}),
    LayerKind("encoder-only layers (embedding models)", {"attn_type": "encoder_only"}),
    LayerKind("encoder-decoder models' decoder layers", {}, True),
    LayerKind("encoder-decoder models' encoder layers", {"attn_type": "encoder"}, True),
    LayerKind("encoder-decoder models' cross-attention", {"attn_type": "encoder_decoder"}, True),
    *(
        LayerKind(label, fields, run_kv_cache_dtype=run, asked_by_doctor=False)
        for label, fields, run in (
            ("sliding-window decoder layers with sinks",
             {"has_sliding_window": True, "has_sink": True}, None),
            ("decoder layers with a KV connector", {"use_kv_connector": True}, None),
            ("MLA layers with a KV connector", {"use_mla": True, "use_kv_connector": True}, None),
            ("decoder layers with a multimodal prefix", {"use_mm_prefix": True}, None),
            ("decoder layers with per-head quant scales", {"use_per_head_quant_scales": True},
             None),
            ("non-causal decoder layers", {"use_non_causal": True}, None),
            ("batch-invariant decoder layers", {"use_batch_invariant": True}, None),
            ("decoder layers under decode context parallel", {"use_dcp": True}, None),
            ("TurboQuant-quantized layers", {"kv_cache_dtype": "turboquant_k8v4"},
             "turboquant_k8v4"),
            ("a TurboQuant run's boundary layers", {"kv_cache_dtype": "auto"}, "turboquant_k8v4"),
        )
    ),
)  # fmt: skip
"""Every kind of attention layer the plugin's selection is checked on (an operator may serve any
of them); the doctor asks about the commoner ones (``DOCTOR_KINDS``)."""
DOCTOR_KINDS = tuple(kind for kind in KINDS if kind.asked_by_doctor)


@dataclass(frozen=True)
class Verdict:
    problem: str | None = None
    note: str | None = None
    meaning: str | None = None  # replaces the variable's meaning line where not None


def selector(
    kind: LayerKind, head_size: int, dtype: Any, kv_cache_dtype: str, block_size: int | None
) -> Any:
    """vLLM's ``AttentionSelectorConfig`` for ``kind``, with the fields this release has."""
    from vllm.v1.attention.selector import AttentionSelectorConfig

    values = {
        "head_size": head_size,
        "dtype": dtype,
        "kv_cache_dtype": kv_cache_dtype,
        "block_size": block_size,
        **kind.fields,
    }
    return AttentionSelectorConfig(
        **{k: v for k, v in values.items() if k in AttentionSelectorConfig._fields}
    )


def outcomes(
    stock_platform: Any,
    requested: Any,
    *,
    head_size: int = 128,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
    kinds: tuple[LayerKind, ...] = DOCTOR_KINDS,
) -> list[tuple[LayerKind, Any]]:
    """Each kind's :class:`~vllm_rocm_aiter_plugin.env_backend.Choice` for ``requested`` on
    ``stock_platform`` (vLLM's ``RocmPlatform``), under a tiny model's config of that kind. A
    kind whose selection raises (stock raises too: nothing on this GPU serves it) is left out."""
    import torch
    from vllm.config import set_current_vllm_config

    from vllm_rocm_aiter_plugin.env_backend import choose, stock_offer

    select = stock_platform.get_attn_backend_cls
    configs = model_configs()
    found = []
    for kind in kinds:
        size = kind.fields.get("head_size", head_size)
        layer = selector(kind, size, torch.bfloat16, kv_cache_dtype, block_size)
        with set_current_vllm_config(configs[kind.encoder_decoder_model]):
            try:
                offer = functools.partial(stock_offer, stock_platform, select, layer)
                choice = choose(select, requested, offer, layer)
            except ValueError:
                continue
        found.append((kind, choice))
    return found


@functools.cache
def model_configs() -> dict[bool, Any]:
    """A tiny model's ``VllmConfig``, decoder-only (False) and encoder-decoder (True): built once
    per process (each build inspects vLLM's model registry), only read by the selection."""
    from vllm_rocm_aiter_plugin.diagnostics import samples

    return {flag: samples.tiny_vllm_config(encoder_decoder=flag) for flag in (False, True)}


def judge(name: str, found: list[tuple[LayerKind, Any]]) -> Verdict:
    """PROBLEM where no kind honours ``name`` (or vLLM's selection served no kind at all: nothing
    could be checked), NOTE where some do not, nothing where all do."""
    if not found:
        return Verdict(
            problem=(
                f"{ENV_VAR}={name}: whether it is honoured could not be checked here: vLLM's own "
                "selection raised for every kind of layer asked about"
            )
        )
    refused = [(kind, choice) for kind, choice in found if choice.refused]
    if not refused:
        return Verdict()
    kind, choice = refused[0]
    if len(refused) == len(found):
        return Verdict(
            problem=(
                f"{ENV_VAR}={name} will not be honoured here: for {kind.label}, {choice.refused}; "
                f"stock's automatic selection applies ({choice.name}). Unset it, or name a backend "
                "stock's automatic selection accepts here"
            ),
            meaning=f"names {name}, which is not honoured here: automatic selection",
        )
    honoured = ", ".join(k.label for k, c in found if not c.refused)
    others = "; ".join(f"{k.label}: {c.name}" for k, c in refused)
    return Verdict(
        note=(
            f"{ENV_VAR}={name}: honoured for {honoured}; not for the other kinds of layer, which "
            f"get stock's automatic choice ({others}). For {kind.label}: {choice.refused}"
        )
    )


def variable_reading(
    raw: str | None, head_size: int, kv_cache_dtype: str, block_size: int | None
) -> tuple[Any, str | None]:
    """The doctor's reading of ``VLLM_ATTENTION_BACKEND=raw`` (an ``envs.Reading``) and its note:
    which backend the name selects (``env_backend.resolve``), and whether it is honoured here
    (:func:`verdict_here`), for layers of ``head_size`` and ``kv_cache_dtype``."""
    from vllm_rocm_aiter_plugin.env_backend import resolve
    from vllm_rocm_aiter_plugin.envs import Reading

    reading = resolve(raw)
    if reading.value is None:
        return reading, None
    name = reading.value.name
    try:
        verdict = verdict_here(name, head_size, kv_cache_dtype, block_size)
    except (LookupError, OSError, SyntaxError) as exc:
        problem = (
            f"{ENV_VAR}={name}: whether it is honoured could not be checked on this vLLM "
            f"({type(exc).__name__}: {exc})"
        )
        return Reading(reading.value, reading.meaning, problem), None
    return Reading(reading.value, verdict.meaning or reading.meaning, verdict.problem), verdict.note


def verdict_here(
    name: str, head_size: int = 128, kv_cache_dtype: str = "auto", block_size: int | None = None
) -> Verdict:
    """The doctor's verdict on ``VLLM_ATTENTION_BACKEND=name`` in this process."""
    from vllm.platforms import current_platform

    if current_platform.is_rocm():
        from vllm.platforms.rocm import RocmPlatform

        from vllm_rocm_aiter_plugin.platform import AiterRocmPlatform

        if not isinstance(current_platform, AiterRocmPlatform):
            return Verdict(
                problem=(
                    f"{ENV_VAR}={name} will not be honoured here: vLLM's platform in this process is "
                    f"{type(current_platform).__qualname__}, not the plugin's (another platform plugin, "
                    "or the plugin switched off); use --attention-backend instead"
                ),
                meaning=f"names {name}, which is not read here: automatic selection",
            )
        found = outcomes(RocmPlatform, _member(name), head_size=head_size, kv_cache_dtype=kv_cache_dtype,
                         block_size=block_size)  # fmt: skip
        return judge(name, found)
    offered = rocm_candidate_names()
    if name != AITER_FA and name not in offered:
        return Verdict(
            problem=(
                f"{ENV_VAR}={name} will not be honoured on ROCm: this vLLM's ROCm selection never "
                f"offers it (it offers {', '.join(offered)}; and {AITER_FA} where AITER is found "
                "and supported). Unset it, or name one of those"
            ),
            meaning=f"names {name}, which vLLM's ROCm selection never offers: automatic selection",
        )
    return Verdict(
        note=(
            f"{ENV_VAR}={name}: not read on this machine (no ROCm GPU). On one, it is honoured for "
            "the layers stock's automatic selection accepts it for"
            + (" (and wherever AITER is found and supported)" if name == AITER_FA else "")
            + ": run the doctor there"
        )
    )


def _member(name: str) -> Any:
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name]


def rocm_candidate_names() -> list[str]:
    """Every backend this vLLM's ROCm selection names in ``_get_backend_priorities``, for any
    kind of model; raises LookupError where its source does not have that function."""
    spec = importlib.util.find_spec("vllm.platforms.rocm")
    if spec is None or not spec.origin:
        raise LookupError("vllm.platforms.rocm is not installed")
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=spec.origin)
    function = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == PRIORITIES_FUNCTION),
        None,
    )
    if function is None:
        raise LookupError(f"{spec.origin} has no {PRIORITIES_FUNCTION}")
    names = [
        node.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "AttentionBackendEnum"
    ]
    return list(dict.fromkeys(names))
