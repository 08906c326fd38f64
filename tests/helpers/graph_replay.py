"""Uniform-decode steps (EAGLE verification, plain decodes) replayed on the metadata of a
CUDA-graph capture, as a captured graph runs them, each request's output judged against its
dense reference.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from vllm_rocm_aiter_plugin.diagnostics.forward import harness, reference_kernels
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import (
    CASES,
    TOLERANCE,
    ForwardCase,
    Request,
    configuration,
    decode,
)
from vllm_rocm_aiter_plugin.diagnostics.forward.runner import own_build_ran
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import StepTensors, lay_out

REPLAY_CASES = tuple(case for case in CASES if case.graph_replay)
"""The catalogue's cases a CUDA graph serves (uniform decodes), captured and replayed here."""


def replay_steps(case: ForwardCase) -> list[tuple[Request, ...]]:
    """The steps replayed on the capture: the case's own, then one whose contexts differ."""
    later = tuple(
        decode(r.req_id, 150 - 29 * i, r.query_len, r.num_drafts)
        for i, r in enumerate(case.requests)
    )
    return [case.requests, later]


def capture_step(case: ForwardCase) -> tuple[Request, ...]:
    """The batch the runner captures with: the same queries on no context (a dummy batch)."""
    return tuple(decode(r.req_id, 0, r.query_len, r.num_drafts) for r in case.requests)


@dataclasses.dataclass
class PersistentInputs:
    """The runner's input buffers, sized for every step: each step is written into them."""

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor

    @classmethod
    def for_steps(cls, steps: Sequence[StepTensors]) -> PersistentInputs:
        first = steps[0]
        width = max(s.batch.block_table_tensor.shape[1] for s in steps)
        rows = first.batch.block_table_tensor.shape[0]
        return cls(
            query_start_loc=torch.empty_like(first.batch.query_start_loc),
            seq_lens=torch.empty_like(first.batch.seq_lens),
            block_table=first.batch.block_table_tensor.new_zeros(rows, width),
            slot_mapping=torch.empty_like(first.batch.slot_mapping),
            query=torch.empty_like(first.query),
            key=torch.empty_like(first.key),
            value=torch.empty_like(first.value),
        )

    def hold(self, step: StepTensors, max_seq_len: int | None = None) -> Any:
        """Write ``step`` into the buffers; its batch over them (``max_seq_len`` as given)."""
        batch = step.batch
        self.query_start_loc.copy_(batch.query_start_loc)
        self.seq_lens.copy_(batch.seq_lens)
        self.block_table.zero_()
        self.block_table[:, : batch.block_table_tensor.shape[1]] = batch.block_table_tensor
        self.slot_mapping.copy_(batch.slot_mapping)
        for name in ("query", "key", "value"):
            getattr(self, name).copy_(getattr(step, name))
        return dataclasses.replace(
            batch,
            query_start_loc=self.query_start_loc,
            seq_lens=self.seq_lens,
            block_table_tensor=self.block_table,
            slot_mapping=self.slot_mapping,
            max_seq_len=batch.max_seq_len if max_seq_len is None else max_seq_len,
        )


class EagerStandIn:
    """Where no graph can be captured: the forward runs again on the capture's metadata."""

    mode = "eager stand-in"

    def capture(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._forward = forward
        return forward()

    def replay(self) -> torch.Tensor:
        return self._forward()


class CudaGraph:
    """A real ``torch.cuda.CUDAGraph``: warmed up on a side stream, captured, replayed."""

    mode = "cuda graph"

    def capture(self, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            forward()
        torch.cuda.current_stream().wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._output = forward()
        return self._output

    def replay(self) -> torch.Tensor:
        self._graph.replay()
        torch.cuda.synchronize()
        return self._output


def graph_for(device: torch.device) -> EagerStandIn | CudaGraph:
    """A real graph where AITER's kernels run (nothing replaced), else the eager stand-in."""
    if device.type == "cuda" and reference_kernels.aiter_available():
        return CudaGraph()
    return EagerStandIn()


def run_kind(
    runner: Any, case: ForwardCase, kind: str, backend: type, seed: int = 0
) -> dict[str, Any]:
    """Capture ``case``'s dummy batch with ``backend``, replay the later steps on it."""
    device = runner.device
    captured = lay_out(case, capture_step(case), device, seed)
    steps = [
        lay_out(case, requests, device, seed + 1 + i)
        for i, requests in enumerate(replay_steps(case))
    ]
    result: dict[str, Any] = {"kind": kind}
    try:
        config, layer, kv_cache, group = runner.prepare(
            case, backend, max(s.num_blocks for s in (captured, *steps))
        )
        inputs = PersistentInputs.for_steps([captured, *steps])
        max_model_len = int(config.model_config.max_model_len)
        meta = runner.metadata(
            group, case, inputs.hold(captured, max_model_len), for_cudagraph_capture=True
        )
        graph = graph_for(device)
        result["graph"] = graph.mode
        result["regions"] = [meta.num_decodes, meta.num_extends, meta.num_prefills]
        result["own_build"] = own_build_ran(group)
        decode_metadata = getattr(meta, "decode_metadata", None)
        result["sliding_window_decode_tables"] = (
            getattr(decode_metadata, "swa_block_table", None) is not None
        )

        def forward(on: Any = meta) -> torch.Tensor:
            return harness.layer_forward(
                config, layer, on, inputs.slot_mapping, inputs.query, inputs.key, inputs.value
            )

        graph.capture(forward)
        frozen = copy.deepcopy(meta) if isinstance(graph, EagerStandIn) else None
        result["replays"] = []
        result["frozen_replays"] = []
        for step in steps:
            if step.context_k.shape[0]:  # earlier steps' tokens, written outside the graph
                layer.impl.do_kv_cache_update(
                    layer, step.context_k, step.context_v, kv_cache, step.context_slots
                )
            runner.metadata(group, case, inputs.hold(step))  # the step's build, then the replay
            result["replays"].append(rows(runner.judge(case, step, meta, graph.replay())))
            if frozen is not None:
                with reference_alone(runner.unified_attention):
                    frozen_rows = runner.judge(case, step, meta, forward(frozen))
                result["frozen_replays"].append(rows(frozen_rows))
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def reference_alone(kernel: Any) -> contextlib.AbstractContextManager[None]:
    """The frozen control on the torch reference where AITER's kernel runs interpreted (its
    outputs are off because its metadata is stale, whichever kernel reads it)."""
    from tests.helpers.aiter_triton import AiterUnifiedAttention

    if isinstance(kernel, AiterUnifiedAttention):
        return kernel.reference_alone()
    return contextlib.nullcontext()


def rows(judged: list[Any]) -> list[dict[str, Any]]:
    return [dataclasses.asdict(row) for row in judged]


def run_case(runner: Any, case: ForwardCase, backends: Mapping[str, type]) -> dict[str, Any]:
    """One replay case with each of ``backends`` (kind -> backend class)."""
    result: dict[str, Any] = {
        "case": case.name,
        "tolerance": TOLERANCE[case.dtype],
        "note": case.note,
        "configuration": configuration(case),
    }
    for kind, backend in backends.items():
        result[kind] = run_kind(runner, case, kind, backend)
    return result


def run_all(runner: Any, backends: Mapping[str, type]) -> list[dict[str, Any]]:
    """Every replay case with each of ``backends``: the report's ``graph_replays``."""
    return [run_case(runner, case, backends) for case in REPLAY_CASES]
