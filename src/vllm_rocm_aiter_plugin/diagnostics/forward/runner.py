"""Run forward cases through vLLM's real ROCM_AITER_FA forward, with stock's backend and the
plugin's, and judge every request's output against its dense reference.

``python -m vllm_rocm_aiter_plugin.diagnostics.forward.runner [--cases NAME ...] [--json PATH]``
runs in the current process: on CPU start it with ``harness.INTERPRETER_ENV``
(:func:`run_in_child` does). Each case reports, per backend ("stock", "plugin"): the regions, the
context chunks, which body the plugin's builder ran, and per request its region, largest error and
whether its output has NaN or inf; or the exception the build or forward raised. Cases in V2
order also report how many context chunks stock's builder makes for the same requests in V1 order.
Where the installed vLLM has no V1 runner, V1-order cases are absent from the report and
``v1_order_absent`` says why, once.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from unittest import mock

import torch

from vllm_rocm_aiter_plugin.builder import FAST_BUILD_ENV
from vllm_rocm_aiter_plugin.diagnostics.forward import aiter_triton, harness, reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    CASES,
    CASES_BY_NAME,
    TOLERANCE,
    ForwardCase,
    StepTensors,
    configuration,
    dense_reference,
    lay_out,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import why_no_v1_order
from vllm_rocm_aiter_plugin.diagnostics.probe import run_process

DEFAULT_GATHER_BUDGET = 2048
"""Gather calls up to this many tokens run vLLM's Triton kernel (about 2 ms per token and head in
the interpreter); larger ones run the reference, checked against the kernel on this many tokens."""

RESULT_MARK = "@@FORWARD@@"


KINDS = ("stock", "plugin")
CONTROLS = ("plugin-builder-only", "plugin-vllm-build")
"""The plugin's builder with vLLM's own impl (what the plugin's impl is there for), and the
plugin's backend with ``VLLM_ROCM_AITER_PLUGIN_FAST_BUILD=0`` (vLLM's build() code with the
plugin's split: stock's context chunk sizes)."""


def backend_for(kind: str) -> type:
    """The backend class a kind runs: stock's, the plugin's, a control, or the registered one."""
    from vllm.v1.attention.backends.rocm_aiter_fa import (
        AiterFlashAttentionBackend,
        AiterFlashAttentionImpl,
    )

    from vllm_rocm_aiter_plugin.backend import PluginAiterFlashAttentionBackend

    if kind == "stock":
        return AiterFlashAttentionBackend
    if kind in ("plugin", "plugin-vllm-build"):
        return PluginAiterFlashAttentionBackend
    if kind == "plugin-builder-only":
        return type(
            "PluginBuilderOnlyBackend",
            (PluginAiterFlashAttentionBackend,),
            {"get_impl_cls": staticmethod(lambda: AiterFlashAttentionImpl)},
        )
    if kind == "registered":
        return _registered_backend()
    raise ValueError(f"unknown kind {kind!r}; known: {backends_names()}")


def backends_names() -> tuple[str, ...]:
    return (*KINDS, *CONTROLS, "registered")


@functools.cache
def _registered_backend() -> type:
    """What ``ROCM_AITER_FA`` resolves to once vLLM has loaded its general plugins."""
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()
    return AttentionBackendEnum.ROCM_AITER_FA.get_class()


class Runner:
    """One per process: a tiny model directory per head shape, the gather, the references."""

    def __init__(self, device: torch.device, gather_budget: int | None = DEFAULT_GATHER_BUDGET):
        kernel, origin = harness.vllm_gather_kernel()
        self.device = device
        self.gather = harness.Gather(kernel, gather_budget)
        self.gather_origin = origin
        self.shuffle_write = harness.ShuffleWrite(
            harness.vllm_rocm_kernel(harness.SHUFFLE_WRITE_NAME)[0]
        )
        self._dirs = tempfile.TemporaryDirectory(prefix="forward-models-")
        self._configs = 0
        self.references: list[str] = []
        self.unified_attention: aiter_triton.UnifiedAttention | None = None

    def close(self) -> None:
        self._dirs.cleanup()

    def config(self, case: ForwardCase) -> Any:
        from vllm_rocm_aiter_plugin.diagnostics import samples

        self._configs += 1  # a fresh VllmConfig per backend: layer names are per config
        directory = os.path.join(self._dirs.name, f"m{self._configs}")
        samples.write_tiny_llama(directory, case.head_size, case.num_heads, case.num_kv_heads)
        return samples.tiny_vllm_config(
            directory,
            num_speculative_tokens=case.spec_tokens,
            dtype=case.dtype,
            block_size=case.block_size,
            device="cuda" if self.device.type == "cuda" else "cpu",
            cache_dtype=case.kv_cache_dtype,
        )

    def prepare(
        self,
        case: ForwardCase,
        kind: str,
        num_blocks: int,
        bodies: harness.BuildBodies | None = None,
    ) -> tuple[Any, Any, torch.Tensor, Any]:
        """(config, layer, KV cache, attention group) for ``kind``'s backend: the cache bound
        first (as vLLM binds it before any build: the shuffle layout's scale tables read its
        shape), then the group whose builder vLLM creates."""
        from vllm_rocm_aiter_plugin.diagnostics import samples
        from vllm_rocm_aiter_plugin.diagnostics.model_runner import attention_group

        backend = harness.runnable_backend(
            backend_for(kind),
            self.gather,
            case.fp8_dtype,
            self.shuffle_write if case.shuffle else None,
            bodies,
        )
        config = self.config(case)
        name = samples.attention_layer(
            config,
            sliding_window=case.sliding_window,
            backend=backend,
            sinks=case.sink_tensor(self.device),
        )
        layer = config.compilation_config.static_forward_context[name].to(self.device)
        set_kv_scales(layer, case.k_scale, case.v_scale)
        kv_cache = harness.allocate_kv_cache(
            layer.attn_backend,
            num_blocks,
            case.block_size,
            case.num_kv_heads,
            case.head_size,
            torch.uint8 if case.fp8 else getattr(torch, case.dtype),  # vLLM's fp8 spec dtype
            self.device,
            shuffle=case.shuffle,
        )
        harness.bind_kv_cache(config, layer.layer_name, kv_cache)
        spec = samples.kv_cache_spec(config, sliding_window=case.sliding_window)
        with mock.patch.dict(
            os.environ, {FAST_BUILD_ENV: "0"} if kind == "plugin-vllm-build" else {}
        ):
            group = attention_group(backend, config, name, spec, self.device)
        return config, layer, kv_cache, group

    def metadata(
        self, group: Any, case: ForwardCase, batch: Any, for_cudagraph_capture: bool = False
    ) -> Any:
        """The layer's metadata for ``batch`` through vLLM's build_attn_metadata."""
        from vllm_rocm_aiter_plugin.diagnostics.cpu_host import unpinned_host_memory
        from vllm_rocm_aiter_plugin.diagnostics.model_runner import build_through_v2

        pinning = unpinned_host_memory() if self.device.type == "cpu" else contextlib.nullcontext()
        with pinning:  # vLLM's extend path pins host memory; there is none without a GPU
            return build_through_v2(
                group,
                batch,
                max_query_len=case.max_query_len,
                with_upper_bound=case.with_upper_bound,
                for_cudagraph_capture=for_cudagraph_capture,
            )

    def build(
        self,
        case: ForwardCase,
        kind: str,
        step: StepTensors,
        bodies: harness.BuildBodies | None = None,
    ) -> tuple[Any, Any, Any, torch.Tensor]:
        """(config, layer, metadata, KV cache) for ``kind``'s backend and ``step``."""
        config, layer, kv_cache, group = self.prepare(case, kind, step.num_blocks, bodies)
        return config, layer, self.metadata(group, case, step.batch), kv_cache

    @functools.cached_property
    def shuffle_write_ignores_kv_scales(self) -> bool | str | None:
        """Whether vLLM's shuffle-layout cache write stores fp8 values without the layer's KV
        scales (measured on its kernel); None where that layout cannot run here; a string saying
        why the measurement failed (the cases it decides are then set aside with it)."""
        if self.shuffle_write.kernel is None or harness.shuffle_layout_unavailable():
            return None
        from vllm.platforms import current_platform

        try:
            return self.shuffle_write.ignores_kv_scales(current_platform.fp8_dtype(), self.device)
        except Exception as exc:
            return f"not measured: {type(exc).__name__}: {exc}"

    def shuffle_write_unusable(self, case: ForwardCase) -> str | None:
        """Why vLLM's shuffle-layout cache write cannot serve ``case``, or None: an fp8 case with
        KV scales on a release whose write ignores them, or where that could not be measured."""
        scaled = (case.k_scale, case.v_scale) != (1.0, 1.0)
        ignores = self.shuffle_write_ignores_kv_scales
        if not (case.shuffle and case.fp8 and scaled and ignores):
            return None
        if isinstance(ignores, str):
            return (
                "whether this vLLM's shuffle-layout cache write honours the KV scales could not "
                f"be measured ({ignores})"
            )
        return (
            "this vLLM's shuffle-layout cache write ignores the KV scales (it stores fp8 values "
            "without dividing by them: stock's and the plugin's alike, docs/upstream/README.md)"
        )

    def run_kind(self, case: ForwardCase, kind: str, step: StepTensors) -> dict[str, Any]:
        result: dict[str, Any] = {"kind": kind}
        bodies = harness.BuildBodies()
        try:
            config, layer, meta, kv_cache = self.build(case, kind, step, bodies)
        except Exception as exc:
            result["error"] = f"build raises {type(exc).__name__}: {exc}"
            return result
        if bodies.own or bodies.vllm:
            result["builder_body"] = "own" if bodies.own else "vllm-build"
        result["regions"] = [meta.num_decodes, meta.num_extends, meta.num_prefills]
        result["chunks"] = chunks_of(meta)
        if meta.extend_metadata is not None:
            totals = meta.extend_metadata.chunk_context_metadata.total_token_per_batch
            result["largest_chunk_tokens"] = max(totals, default=0)
        calls_before = self.unified_attention.calls if self.unified_attention else 0
        try:
            output = self.forward(config, layer, meta, step, kv_cache)
        except Exception as exc:
            result["error"] = f"forward raises {type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc(limit=-6)
            return result
        finally:
            if self.unified_attention is not None:
                result["unified_attention_calls"] = self.unified_attention.calls - calls_before
        result["rows"] = self.judge(case, step, meta, output)
        return result

    def forward(
        self, config: Any, layer: Any, meta: Any, step: StepTensors, kv_cache: torch.Tensor
    ) -> torch.Tensor:
        if step.context_k.shape[0]:  # earlier steps' tokens, written by vLLM's own cache update
            layer.impl.do_kv_cache_update(
                layer, step.context_k, step.context_v, kv_cache, step.context_slots
            )
        return harness.layer_forward(
            config, layer, meta, step.batch.slot_mapping, step.query, step.key, step.value
        )

    def judge(
        self, case: ForwardCase, step: StepTensors, meta: Any, output: torch.Tensor
    ) -> list[dict[str, Any]]:
        first_extend = meta.num_decodes
        first_prefill = meta.num_decodes + meta.num_extends
        rows = []
        for row, request in enumerate(step.requests):
            got = output[step.token_rows[row]].float()
            region = (
                "decode" if row < first_extend else "extend" if row < first_prefill else "prefill"
            )
            want = dense_reference(case, step, row, region)
            finite = bool(torch.isfinite(got).all())
            error = float((got - want).abs().max()) if finite and got.numel() else 0.0
            rows.append(
                {
                    "req_id": request.req_id,
                    "context": request.context_len,
                    "query": request.query_len,
                    "region": region,
                    "error": error if finite else None,
                    "nan": not finite,
                }
            )
        return rows

    def run_case(
        self, case: ForwardCase, seed: int = 0, kinds: Sequence[str] = KINDS
    ) -> dict[str, Any]:
        why_not = not_applicable_here(case, self.device) or self.shuffle_write_unusable(case)
        if why_not:
            return {
                "case": case.name,
                "order": case.order,
                "configuration": configuration(case),
                "not_applicable": why_not,
            }
        start = time.monotonic()
        step = lay_out(case, case.ordered(), self.device, seed)
        result: dict[str, Any] = {
            "case": case.name,
            "order": case.order,
            "threshold": case.threshold,
            "order_ids": [r.req_id for r in step.requests],
            "tolerance": TOLERANCE[case.dtype],
            "note": case.note,
            "configuration": configuration(case),
        }
        for kind in kinds:
            result[kind] = self.run_kind(case, kind, step)
        if case.order == "v2" and why_no_v1_order() is None:
            v1 = lay_out(case, case.ordered("v1"), self.device, seed)
            try:
                result["v1_stock_chunks"] = chunks_of(self.build(case, "stock", v1)[2])
            except Exception as exc:
                result["v1_stock_chunks"] = f"build raises {type(exc).__name__}: {exc}"
        result["seconds"] = round(time.monotonic() - start, 1)
        return result


def set_kv_scales(layer: Any, k_scale: float, v_scale: float) -> None:
    """The layer's KV-cache scales, where a checkpoint's would be loaded (this layer object's
    tensors and floats; vLLM's defaults are 1.0)."""
    for side, value in (("k", k_scale), ("v", v_scale)):
        getattr(layer, f"_{side}_scale").fill_(value)
        setattr(layer, f"_{side}_scale_float", value)


def not_applicable_here(case: ForwardCase, device: torch.device) -> str | None:
    """Why ``case`` cannot run on ``device``, or None: a non-causal case where this release's
    model-runner V2 builds causal batches only; an fp8 format that is not the GPU's own (a GPU
    reads an fp8 cache in its ``current_platform.fp8_dtype()``; the CPU tier runs every one); a
    shuffle-layout case where stock's shuffle layout cannot run right
    (:func:`harness.shuffle_layout_unavailable`); a sinks case where this release's ROCM_AITER_FA
    takes no sinks."""
    if case.sinks and not takes_sinks():
        return "this release's ROCM_AITER_FA takes no attention sinks (supports_sink)"
    if not case.causal and not builds_non_causal_batches():
        return (
            "this release's model-runner V2 builds causal batches only (its "
            "build_attn_metadata takes no causal)"
        )
    if case.shuffle:
        unavailable = harness.shuffle_layout_unavailable()
        if unavailable:
            return unavailable
    if not case.fp8 or device.type == "cpu":
        return None
    from vllm.platforms import current_platform

    own = current_platform.fp8_dtype()
    if own == case.fp8_dtype:
        return None
    return (
        f"this GPU's fp8 format is {str(own).removeprefix('torch.')}, the case's "
        f"{case.fp8_format}: the CPU tier runs it"
    )


def takes_sinks() -> bool:
    """Whether this release's ROCM_AITER_FA backend says it supports attention sinks."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

    supports_sink = getattr(AiterFlashAttentionBackend, "supports_sink", None)
    return bool(supports_sink and supports_sink())


def vllm_counts_sink_once_here() -> bool | None:
    """Whether this release's own ``extend_forward`` counts a sink once (``impl``'s run of it)."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionImpl

    from vllm_rocm_aiter_plugin.impl import vllm_counts_sink_once

    return vllm_counts_sink_once(AiterFlashAttentionImpl.extend_forward)


def builds_non_causal_batches() -> bool:
    """Whether this release's model-runner V2 can build a non-causal batch (0.33)."""
    import inspect

    from vllm.v1.worker.gpu.attn_utils import build_attn_metadata

    return "causal" in inspect.signature(build_attn_metadata).parameters


def chunks_of(meta: Any) -> int:
    extend = meta.extend_metadata
    return 0 if extend is None else int(extend.chunk_context_metadata.num_chunks)


def release_merge_makes_nan_of_empty_states(device: torch.device) -> bool:
    """vLLM's own ``merge_attn_states`` on one token whose both sides are empty (lse -inf)."""
    from vllm.v1.attention.ops.merge_attn_states import merge_attn_states

    empty = torch.zeros(1, 1, 64, dtype=torch.float16, device=device)
    lse = torch.full((1, 1), float("-inf"), device=device)
    out, out_lse = torch.empty_like(empty), torch.empty_like(lse)
    merge_attn_states(
        output=out, prefix_output=empty, prefix_lse=lse, suffix_output=empty.clone(),
        suffix_lse=lse.clone(), output_lse=out_lse,
    )  # fmt: skip
    return bool(out.isnan().any() or out_lse.isnan().any())


def why_unavailable(device: torch.device) -> str | None:
    """Why vLLM's forward cannot run on ``device`` in this process, or None."""
    from vllm.platforms import current_platform

    if device.type == "cpu" and (current_platform.is_cuda() or current_platform.is_rocm()):
        return (
            f"vLLM's platform here is {type(current_platform).__name__}: its merges dispatch to "
            "the GPU op, which takes no CPU tensors; the GPU tiers run this forward on the GPU"
        )
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "vLLM's Triton kernels need TRITON_INTERPRET=1 on CPU (run_in_child sets it)"
    return None


def unified_attention_for(device: torch.device) -> aiter_triton.UnifiedAttention | None:
    """What the forward runs as AITER's ``unified_attention``: None where the real AITER is
    importable (ROCm: nothing is replaced); on CPU AITER's own Triton kernel where the
    ``amd-aiter`` wheel loads, else the torch reference; the reference on other devices
    (AITER's Triton kernels target HIP)."""
    if reference_kernels.aiter_available():
        return None
    if device.type == "cpu":
        kernel, why_not = aiter_triton.load_unified_attention()
        if kernel is not None:
            return kernel
    else:
        why_not = f"AITER's Triton kernels target HIP, not {device.type}"
    origin = f"the torch reference ({why_not})"
    return aiter_triton.UnifiedAttention(
        reference_kernels.unified_attention, origin, is_aiter=False
    )


@contextlib.contextmanager
def forward_environment(device: torch.device, gather_budget: int | None) -> Iterator[Runner]:
    runner = Runner(device, gather_budget)
    runner.unified_attention = unified_attention_for(device)
    try:
        with reference_kernels.installed(runner.unified_attention) as references:
            runner.references = references
            yield runner
    finally:
        runner.close()


def run(
    names: Sequence[str] | None = None,
    device: str = "cpu",
    gather_budget: int | None = DEFAULT_GATHER_BUDGET,
    cases: Sequence[ForwardCase] | None = None,
    control: Sequence[str] = (),
    kinds: Sequence[str] = KINDS,
    extra: Mapping[str, Callable[[Runner], Any]] | None = None,
) -> dict[str, Any]:
    """Run the named cases (all by default) here with the backends ``kinds`` (plus the
    ``CONTROLS`` for the cases named in ``control``); the report as one JSON-able dict.
    ``extra`` adds entries to the report, each computed with the same runner (the tests'
    CUDA-graph replay cases)."""
    import vllm

    import vllm_rocm_aiter_plugin

    if cases is None:
        cases = [CASES_BY_NAME[n] for n in names] if names else CASES
    no_v1 = why_no_v1_order()
    if no_v1:
        cases = [case for case in cases if case.order != "v1"]
    torch_device = torch.device(device)
    unavailable = why_unavailable(torch_device)
    if unavailable:
        return {"vllm": vllm.__version__, "unavailable": unavailable}
    with forward_environment(torch_device, gather_budget) as runner:
        report: dict[str, Any] = {
            "vllm": vllm.__version__,
            "torch": torch.__version__,
            "plugin_file": vllm_rocm_aiter_plugin.__file__,
            "device": str(torch_device),
            "gather": runner.gather_origin,
            "v1_order_absent": no_v1,
            "takes_sinks": takes_sinks(),
            "vllm_counts_sink_once": vllm_counts_sink_once_here(),
            "merge_makes_nan_of_empty_states": release_merge_makes_nan_of_empty_states(
                torch_device
            ),
            "cases": [
                runner.run_case(case, kinds=(*kinds, *CONTROLS) if case.name in control else kinds)
                for case in cases
            ],
        }
        for key, produce in (extra or {}).items():
            report[key] = produce(runner)
        report["shuffle_write_ignores_kv_scales"] = runner.shuffle_write_ignores_kv_scales
        report["references"] = runner.references
        report["unified_attention"] = (
            runner.unified_attention.to_json()
            if runner.unified_attention is not None
            else {"kernel": "AITER's (ROCm)", "aiter": True, "calls": None}
        )
        report["gather_calls"] = {
            "kernel": runner.gather.kernel_calls,
            "reference": runner.gather.reference_calls,
            "kernel_checked_tokens": runner.gather.checked_tokens,
        }
        report["shuffle_write_calls"] = {
            "kernel": runner.shuffle_write.kernel_calls,
            "reference": runner.shuffle_write.reference_calls,
            "interpreter_carry_losses": runner.shuffle_write.interpreter_carry_losses,
            "interpreter_rounding_steps": runner.shuffle_write.interpreter_rounding_steps,
        }
    return report


def run_in_child(
    names: Sequence[str] | None = None,
    gather_budget: int | None = DEFAULT_GATHER_BUDGET,
    timeout: float = 1800,
    extra_env: dict[str, str] | None = None,
    control: Sequence[str] = (),
    kinds: Sequence[str] = KINDS,
    device: str = "cpu",
    cases: Sequence[ForwardCase] | None = None,
    module: str = __name__,
    extra_args: Sequence[str] = (),
) -> dict[str, Any]:
    """:func:`run` in a new interpreter; on CPU started with Triton's interpreter environment.
    ``cases`` (any, e.g. from vLLM's Scheduler) run instead of the named ones. ``module`` is
    the child's entry (one whose ``main`` parses :func:`argument_parser`'s arguments, and
    ``extra_args``)."""
    command = [sys.executable, "-m", module, "--device", device, "--kinds", *kinds]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as spec:
        json.dump([case.to_json() for case in cases or ()], spec)
    if cases is not None:
        command += ["--cases-json", spec.name]
        names = []
    command += ["--gather-budget", "all" if gather_budget is None else str(gather_budget)]
    if names is not None:
        command += ["--cases", *names]
    if control:
        command += ["--control", *control]
    command += extra_args
    interpreter = harness.INTERPRETER_ENV if device == "cpu" else {}
    env = {**os.environ, **interpreter, **(extra_env or {})}
    try:
        proc = run_process(command, env=env, cwd=None, timeout=timeout)
    finally:
        os.unlink(spec.name)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    raise RuntimeError(
        f"the forward runner exited {proc.returncode} without a report:\n"
        f"{(proc.stdout + proc.stderr)[-4000:]}"
    )


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=None, choices=sorted(CASES_BY_NAME))
    parser.add_argument(
        "--control",
        nargs="*",
        default=(),
        help=f"cases also run with {', '.join(CONTROLS)}",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=sorted(backends_names()))
    parser.add_argument("--gather-budget", default=str(DEFAULT_GATHER_BUDGET))
    parser.add_argument("--cases-json", metavar="PATH", help="cases as written by to_json")
    parser.add_argument("--json", metavar="PATH", help="also write the report here")
    return parser


def run_parsed(
    args: argparse.Namespace,
    more_cases: Sequence[ForwardCase] = (),
    extra: Mapping[str, Callable[[Runner], Any]] | None = None,
) -> dict[str, Any]:
    """:func:`run` with :func:`argument_parser`'s arguments (and ``more_cases`` after the rest)."""
    cases = [CASES_BY_NAME[n] for n in args.cases] if args.cases is not None else list(CASES)
    if args.cases_json:
        with open(args.cases_json) as f:
            cases += [ForwardCase.from_json(data) for data in json.load(f)]
    return run(
        device=args.device,
        gather_budget=None if args.gather_budget == "all" else int(args.gather_budget),
        cases=[*cases, *more_cases],
        control=args.control,
        kinds=args.kinds,
        extra=extra,
    )


def emit(report: dict[str, Any], json_path: str | None) -> int:
    """Hand ``report`` to the parent (one marked line on stdout), and to ``json_path``."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    if "unified_attention" in report:
        used = report["unified_attention"]
        print(f"forward tier: unified_attention: {used['kernel']}; calls: {used['calls']}",
              file=sys.stderr)  # fmt: skip
    print(RESULT_MARK + json.dumps(report), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = argument_parser().parse_args(argv)
    return emit(run_parsed(args), args.json)


if __name__ == "__main__":
    sys.exit(main())
