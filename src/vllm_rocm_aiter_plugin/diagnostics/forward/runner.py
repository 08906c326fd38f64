"""Run forward cases through vLLM's real ROCM_AITER_FA forward, with stock's backend and the
plugin's, and judge every request's output against its dense reference.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from vllm_rocm_aiter_plugin import exposure
from vllm_rocm_aiter_plugin.diagnostics import child, probe
from vllm_rocm_aiter_plugin.diagnostics.forward import harness, reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    TOLERANCE,
    ForwardCase,
    configuration,
)
from vllm_rocm_aiter_plugin.diagnostics.forward.report import (
    CaseResult,
    ForwardReport,
    ForwardRequest,
    Outcome,
    Resolution,
    Row,
)
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import (
    StepTensors,
    dense_reference,
    in_order,
    lay_out,
)
from vllm_rocm_aiter_plugin.diagnostics.model_runner import (
    builds_non_causal_batches,
    why_no_v1_order,
)

KINDS = ("stock", "plugin")


def backend_for(kind: str) -> type:
    """The backend class a kind runs: stock's, the plugin's, observe mode's (stock's with a
    builder that counts), or the registered one (whatever ``ROCM_AITER_FA`` resolves to once
    vLLM has loaded its general plugins)."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

    from vllm_rocm_aiter_plugin import backend

    if kind == "stock":
        return AiterFlashAttentionBackend
    if kind == "plugin":
        return backend.PluginAiterFlashAttentionBackend
    if kind == "observe":
        return backend.ObservingAiterFlashAttentionBackend
    if kind == "registered":
        return _registered_backend()
    raise ValueError(f"unknown kind {kind!r}; known: stock, plugin, observe, registered")


@functools.cache
def _registered_backend() -> Any:
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()
    return AttentionBackendEnum.ROCM_AITER_FA.get_class()


class Runner:
    """One per process: a tiny model directory per backend run, the gather, the references."""

    def __init__(self, device: torch.device, kernel_budget: int | None):
        kernel, origin = harness.vllm_rocm_kernel(harness.GATHER_NAME)
        self.device = device
        self.gather = harness.Gather(kernel, kernel_budget)
        self.gather_origin = origin
        self.shuffle_write = harness.ShuffleWrite(
            harness.vllm_rocm_kernel(harness.SHUFFLE_WRITE_NAME)[0], kernel_budget
        )
        self.merge = None  # vLLM's own merge as it is, unless its kernel runs interpreted
        if device.type == "cpu" and kernel_budget is not None:
            from vllm.v1.attention.backends import rocm_aiter_fa

            self.merge = harness.Merge(vars(rocm_aiter_fa)[harness.MERGE_NAME], kernel_budget)
        self._dirs = tempfile.TemporaryDirectory(prefix="forward-models-")
        self._configs = 0
        self.references: list[str] = []
        self.unified_attention: harness.UnifiedAttention | None = None

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
        self, case: ForwardCase, backend: type, num_blocks: int
    ) -> tuple[Any, Any, torch.Tensor, Any]:
        """(config, layer, KV cache, attention group) for ``backend``: the cache bound first (as
        vLLM binds it before any build: the shuffle layout's scale tables read its shape), then
        the group whose builder vLLM creates."""
        from vllm_rocm_aiter_plugin.diagnostics import samples
        from vllm_rocm_aiter_plugin.diagnostics.model_runner import attention_group

        if splits_three_ways(backend):
            runnable = harness.runnable_backend(
                backend, self.gather, case.fp8_dtype, self.shuffle_write if case.shuffle else None,
                self.merge,
            )  # fmt: skip
        else:
            runnable = harness.runnable_without_split(backend)
        config = self.config(case)
        name = samples.attention_layer(
            config,
            sliding_window=case.sliding_window,
            backend=runnable,
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
        group = attention_group(runnable, config, name, spec, self.device)
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

    @functools.cached_property
    def shuffle_write_ignores_kv_scales(self) -> bool | str | None:
        """Whether vLLM's shuffle-layout cache write stores fp8 values without the layer's KV
        scales (measured on its kernel); None where that layout cannot run here; a string saying
        why the measurement failed (the cases it decides are then set aside with it)."""
        if self.shuffle_write.kernel is None or probe.shuffle_layout_unavailable():
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

    def run_backend(
        self, case: ForwardCase, kind: str, backend: type, step: StepTensors
    ) -> Outcome:
        outcome = Outcome(kind)
        exposure.new_step()  # each backend serves the step anew
        before = exposure.totals()
        try:
            config, layer, kv_cache, group = self.prepare(case, backend, step.num_blocks)
            meta = self.metadata(group, case, step.batch)
        except Exception as exc:
            outcome.error = f"build raises {type(exc).__name__}: {exc}"
            return outcome
        finally:
            outcome.counted = counted_since(before, group_builder_counts(backend))
        outcome.own_build = own_build_ran(group)
        three_ways = splits_three_ways(backend)
        if three_ways:
            outcome.regions = [meta.num_decodes, meta.num_extends, meta.num_prefills]
            outcome.chunks = chunks_of(meta)
        if three_ways and meta.extend_metadata is not None:
            totals = meta.extend_metadata.chunk_context_metadata.total_token_per_batch
            outcome.largest_chunk_tokens = max(totals, default=0)
        calls_before = self.unified_attention.calls if self.unified_attention else 0
        try:
            if step.context_k.shape[0]:  # earlier steps' tokens, written by vLLM's cache update
                layer.impl.do_kv_cache_update(
                    layer, step.context_k, step.context_v, kv_cache, step.context_slots
                )
            output = harness.layer_forward(
                config, layer, meta, step.batch.slot_mapping, step.query, step.key, step.value
            )
        except Exception as exc:
            outcome.error = f"forward raises {type(exc).__name__}: {exc}"
            outcome.traceback = traceback.format_exc(limit=-6)
            return outcome
        finally:
            if self.unified_attention is not None:
                outcome.unified_attention_calls = self.unified_attention.calls - calls_before
        outcome.rows = self.judge(case, step, meta, output)
        return outcome

    def judge(
        self, case: ForwardCase, step: StepTensors, meta: Any, output: torch.Tensor
    ) -> list[Row]:
        # a backend without the three-way split: every row as a decode row (from the cache)
        first_extend = getattr(meta, "num_decodes", len(step.requests))
        first_prefill = first_extend + getattr(meta, "num_extends", 0)
        rows = []
        for row, request in enumerate(step.requests):
            got = output[step.token_rows[row]].float()
            region = (
                "decode" if row < first_extend else "extend" if row < first_prefill else "prefill"
            )
            want = dense_reference(case, step, row, region)
            finite = bool(torch.isfinite(got).all())
            error = float((got - want).abs().max()) if finite and got.numel() else 0.0
            rows.append(Row(request.req_id, request.context_len, request.query_len, region,
                            error if finite else None, not finite))  # fmt: skip
        return rows

    def run_case(
        self, case: ForwardCase, backends: Mapping[str, type], seed: int = 0
    ) -> CaseResult:
        """``case`` with each of ``backends`` (kind -> backend class); in V2 order, also how
        many context chunks stock's builder makes for the same requests in V1 order."""
        result = CaseResult(case.name, case.order, configuration(case))
        result.not_applicable = not_applicable_here(case, self.device) or (
            self.shuffle_write_unusable(case)
        )
        if result.not_applicable:
            return result
        start = time.monotonic()
        step = lay_out(case, in_order(case.requests, case.order, case.threshold), self.device, seed)
        result.threshold, result.note = case.threshold, case.note
        result.order_ids = [r.req_id for r in step.requests]
        result.tolerance = TOLERANCE[case.dtype]
        for kind, backend in backends.items():
            result.outcomes[kind] = self.run_backend(case, kind, backend, step)
        if case.order == "v2" and why_no_v1_order() is None:
            v1 = lay_out(case, in_order(case.requests, "v1", case.threshold), self.device, seed)
            try:
                group = self.prepare(case, backend_for("stock"), v1.num_blocks)[3]
                result.v1_stock_chunks = chunks_of(self.metadata(group, case, v1.batch))
            except Exception as exc:
                result.v1_stock_chunks = f"build raises {type(exc).__name__}: {exc}"
        result.seconds = round(time.monotonic() - start, 1)
        return result

    def report(self) -> ForwardReport:
        """A report of this process: vLLM, the device, what the release does; no cases yet."""
        import vllm

        import vllm_rocm_aiter_plugin

        return ForwardReport(
            vllm=vllm.__version__,
            torch=torch.__version__,
            plugin_file=vllm_rocm_aiter_plugin.__file__ or "",
            device=str(self.device),
            gather=self.gather_origin,
            facts=probe.release_facts(self.device),
        )

    def count_calls(self, report: ForwardReport) -> None:
        """The report's record of what ran: references, AITER's kernel, gathers, writes."""
        report.shuffle_write_ignores_kv_scales = self.shuffle_write_ignores_kv_scales
        report.references = self.references
        report.unified_attention = (
            self.unified_attention.to_json()
            if self.unified_attention is not None
            else {"kernel": "AITER's (ROCm)", "aiter": True, "calls": None}
        )
        report.gather_calls = harness.counters(self.gather)
        if self.merge is not None:
            report.merge_calls = harness.counters(self.merge)
        report.shuffle_write_calls = harness.counters(self.shuffle_write)


def splits_three_ways(backend: type) -> bool:
    """Whether ``backend`` is ``ROCM_AITER_FA`` (stock's, the plugin's, a control's): decodes,
    extends and prefills; any other (``TRITON_ATTN``): :func:`.harness.runnable_without_split`."""
    from vllm.v1.attention.backends.rocm_aiter_fa import AiterFlashAttentionBackend

    return issubclass(backend, AiterFlashAttentionBackend)


def group_builder_counts(backend: Any) -> bool:
    """Whether ``backend``'s builder counts the exposure (the plugin's, observe mode's)."""
    from vllm_rocm_aiter_plugin.builder import PluginAiterFlashAttentionMetadataBuilder

    return issubclass(backend.get_builder_cls(), PluginAiterFlashAttentionMetadataBuilder)


def counted_since(before: dict[str, Any], counts: bool) -> dict[str, int] | None:
    """What the exposure totals gained since ``before``; None for a builder that never counts."""
    if not counts:
        return None
    now = exposure.totals()
    return {key: now[key] - before[key] for key in ("request_steps", "context_tokens")}


def own_build_ran(group: Any) -> bool | None:
    """Whether the group's builder ran the plugin's own build (None: not the plugin's builder)."""
    builder = group.get_metadata_builder()
    runs_own_build = getattr(builder, "runs_own_build", None)
    return runs_own_build() if runs_own_build is not None else None


def set_kv_scales(layer: Any, k_scale: float, v_scale: float) -> None:
    """The layer's KV-cache scales, where a checkpoint's would be loaded (this layer object's
    tensors and floats; vLLM's defaults are 1.0)."""
    for side, value in (("k", k_scale), ("v", v_scale)):
        getattr(layer, f"_{side}_scale").fill_(value)
        setattr(layer, f"_{side}_scale_float", value)


def not_applicable_here(case: ForwardCase, device: torch.device) -> str | None:
    """Why ``case`` cannot run on ``device``, or None: a sinks case where this release's
    ROCM_AITER_FA takes no sinks; a non-causal case where its model-runner V2 builds causal
    batches only; a shuffle-layout case where stock's shuffle layout cannot run right
    (:func:`probe.shuffle_layout_unavailable`); an fp8 format that is not the GPU's own (a GPU
    reads an fp8 cache in its ``current_platform.fp8_dtype()``; the CPU tier runs every one)."""
    if case.sinks and not probe.takes_sinks():
        return "this release's ROCM_AITER_FA takes no attention sinks (supports_sink)"
    if not case.causal and not builds_non_causal_batches():
        return (
            "this release's model-runner V2 builds causal batches only (its "
            "build_attn_metadata takes no causal)"
        )
    if case.shuffle:
        unavailable = probe.shuffle_layout_unavailable()
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


def chunks_of(meta: Any) -> int:
    extend = meta.extend_metadata
    return 0 if extend is None else int(extend.chunk_context_metadata.num_chunks)


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


def unified_attention_for(device: torch.device) -> harness.UnifiedAttention | None:
    """What the forward runs as AITER's ``unified_attention``: None where the real AITER is
    importable (ROCm: nothing is replaced), else the torch reference."""
    if reference_kernels.aiter_available():
        return None
    return harness.UnifiedAttention(
        reference_kernels.unified_attention, "the torch reference (AITER is not importable here)"
    )


@contextlib.contextmanager
def forward_environment(
    device: torch.device, kernel_budget: int | None, unified_attention: Any = None
) -> Iterator[Runner]:
    """A :class:`Runner` with the references installed where vLLM imports the real kernels
    (``unified_attention``: what runs as AITER's, default :func:`unified_attention_for`; the
    tests give AITER's own Triton kernel)."""
    runner = Runner(device, kernel_budget)
    runner.unified_attention = unified_attention or unified_attention_for(device)
    try:
        with reference_kernels.installed(runner.unified_attention) as references:
            runner.references = references
            yield runner
    finally:
        runner.close()


def cases_here(cases: Sequence[ForwardCase]) -> list[ForwardCase]:
    """``cases`` but the V1-order ones where the installed vLLM has no V1 runner."""
    if why_no_v1_order() is None:
        return list(cases)
    return [case for case in cases if case.order != "v1"]


def resolution() -> Resolution:
    """What ``ROCM_AITER_FA`` resolves to once vLLM has loaded its general plugins, and how that
    backend's builder builds the batches the plugin exists for (``probe``)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_rocm_aiter_plugin.diagnostics.probe import check_builder_behaviour

    builder = _registered_backend().get_builder_cls()
    backend = AttentionBackendEnum.ROCM_AITER_FA
    return Resolution(
        path=backend.get_path(),
        stock=backend.value,
        builder=f"{builder.__module__}.{builder.__qualname__}",
        behaviour=check_builder_behaviour(builder),
    )


def run(request: ForwardRequest) -> ForwardReport:
    """``request`` in this process."""
    import vllm

    device = torch.device(request.device)
    unavailable = why_unavailable(device)
    if unavailable:
        report = ForwardReport(vllm=vllm.__version__, unavailable=unavailable)
    else:
        backends = {kind: backend_for(kind) for kind in request.kinds}
        with forward_environment(device, request.kernel_budget) as runner:
            report = runner.report()
            report.cases = [runner.run_case(c, backends) for c in cases_here(request.cases)]
            runner.count_calls(report)
    if request.resolution:
        try:
            report.resolution = resolution()
        except Exception as exc:
            report.resolution_error = f"{type(exc).__name__}: {exc}"
    return report


def child_env(device: str) -> dict[str, str]:
    """The environment changes a forward child needs: Triton's interpreter on CPU."""
    return dict(harness.INTERPRETER_ENV) if device == "cpu" else {}


def run_in_child(request: ForwardRequest, timeout: float = 1800) -> ForwardReport:
    """:func:`run` in a fresh interpreter."""
    return finish(start(request, timeout))


def start(request: ForwardRequest, timeout: float = 1800) -> child.Started:
    """Start :func:`run` in a fresh interpreter; :func:`finish` reads its report."""
    return child.call(
        f"{__name__}:run_json", request.to_json(), env=child_env(request.device),
        timeout=timeout,
    )  # fmt: skip


def finish(started: child.Started) -> ForwardReport:
    done = child.finish(started)
    if done.result is None:
        raise RuntimeError(
            f"the forward runner exited {done.returncode} without a report:\n{done.output[-4000:]}"
        )
    return ForwardReport.from_json(done.result)


def run_json(request: dict[str, Any]) -> dict[str, Any]:
    """:func:`run` on a JSON request, its report as JSON (the child's side of :func:`start`);
    what ran as AITER's ``unified_attention`` is said on stderr."""
    report = run(ForwardRequest.from_json(request))
    if report.unified_attention:
        used = report.unified_attention
        print(f"forward: unified_attention: {used['kernel']}; calls: {used['calls']}",
              file=sys.stderr)  # fmt: skip
    return report.to_json()
