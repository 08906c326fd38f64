"""The plugin's split against an independent oracle, against stock vLLM, and on malformed input."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vllm.v1.attention.backends import utils as stock_utils

from tests.batches import BatchSpec, mixed_batches, reordered_batches
from tests.oracle import oracle_split
from vllm_rocm_aiter_plugin import samples
from vllm_rocm_aiter_plugin import split as split_module
from vllm_rocm_aiter_plugin.split import split_decodes_prefills_and_extends as plugin_split

pytestmark = pytest.mark.cpu

needs_upper_bound_field = pytest.mark.skipif(
    not samples.has_seq_lens_upper_bound_field(),
    reason="this vLLM's CommonAttentionMetadata has no seq_lens_cpu_upper_bound field",
)


def _batch(spec: BatchSpec, **kwargs: object):
    return samples.make_batch(
        spec.query_lens,
        spec.seq_lens,
        upper_bound_slack=spec.upper_bound_slack,
        num_padding_tokens=spec.num_padding_tokens,
        **kwargs,
    )


def _oracle(spec: BatchSpec) -> tuple[int, ...]:
    return oracle_split(spec.query_lens, spec.seq_lens, spec.num_actual_tokens, spec.threshold)


def _ints(counts: tuple) -> tuple[int, ...]:
    return tuple(int(c) for c in counts)


# (name, threshold, query_lens, seq_lens, expected counts)
REGION_TABLE = [
    ("decode only", 1, [1, 1, 1], [5, 9, 2], (3, 0, 0, 3, 0, 0)),
    ("eagle decode only", 4, [4, 4, 4], [40, 90, 20], (3, 0, 0, 12, 0, 0)),
    ("decode + short extend", 4, [4, 2], [40, 90], (2, 0, 0, 6, 0, 0)),
    ("extend only", 1, [5, 7], [20, 30], (0, 2, 0, 0, 12, 0)),
    ("prefill only", 1, [5, 7], [5, 7], (0, 0, 2, 0, 0, 12)),
    ("decode + extend", 1, [1, 5], [9, 20], (1, 1, 0, 1, 5, 0)),
    ("decode + prefill", 1, [1, 1, 6], [9, 4, 6], (2, 0, 1, 2, 0, 6)),
    ("extend + prefill", 2, [3, 8, 4], [30, 8, 4], (0, 1, 2, 0, 3, 12)),
    ("decode + extend + prefill", 1, [1, 5, 7, 3], [10, 30, 7, 3], (1, 1, 2, 1, 5, 10)),
    (
        "all regions at eagle threshold",
        4,
        [4, 3, 9, 6, 2, 5],
        [50, 60, 70, 6, 2, 5],
        (2, 1, 3, 7, 9, 13),
    ),
    ("short prompt first in prefill region", 4, [4, 2, 8], [40, 2, 8], (2, 0, 1, 6, 0, 8)),
    ("short prompt between long prompts", 4, [4, 9, 2, 8], [40, 9, 2, 8], (1, 0, 3, 4, 0, 19)),
    ("zero-length padded requests", 1, [1, 5, 6, 0, 0], [9, 5, 6, 0, 0], (1, 0, 4, 1, 0, 11)),
    ("extends then padded requests", 1, [1, 5, 0], [9, 30, 0], (1, 2, 0, 1, 5, 0)),
]


@pytest.mark.parametrize(
    "name, threshold, query_lens, seq_lens, expected",
    REGION_TABLE,
    ids=[r[0] for r in REGION_TABLE],
)
def test_region_table(name, threshold, query_lens, seq_lens, expected):
    batch = samples.make_batch(query_lens, seq_lens)
    counts = plugin_split(batch, decode_threshold=threshold)
    assert counts == expected
    assert all(type(c) is int for c in counts)
    assert counts == oracle_split(query_lens, seq_lens, sum(query_lens), threshold)


@pytest.mark.parametrize("padding", [0, 1, 7])
def test_padded_num_actual_tokens_go_to_last_group(padding):
    batch = samples.make_batch([1, 5, 6], [9, 20, 6], num_padding_tokens=padding)
    assert plugin_split(batch) == (1, 1, 1, 1, 5, 6 + padding)
    batch = samples.make_batch([1, 1], [9, 20], num_padding_tokens=padding)
    assert plugin_split(batch) == (2, 0, 0, 2 + padding, 0, 0)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=reordered_batches())
def test_matches_oracle_on_reordered_batches(spec: BatchSpec):
    assert plugin_split(_batch(spec), decode_threshold=spec.threshold) == _oracle(spec)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=mixed_batches(max_rows_per_region=30), with_upper_bound=st.booleans())
def test_small_batch_and_numpy_paths_agree_with_oracle(spec: BatchSpec, with_upper_bound: bool):
    """Both mixed-batch implementations (Python ints up to SMALL_BATCH requests, numpy beyond) on
    every batch, whatever its size."""
    batch = _batch(spec, with_upper_bound=with_upper_bound)
    expected = _oracle(spec)
    assert split_module._split_small(batch, spec.threshold) == expected
    assert split_module._split_mixed(batch, spec.threshold) == expected


@needs_upper_bound_field
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=reordered_batches(max_rows_per_region=30))
def test_matches_installed_vllm_split_when_upper_bound_present(spec: BatchSpec):
    batch = _batch(spec)
    stock = stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=spec.threshold)
    assert plugin_split(batch, decode_threshold=spec.threshold) == _ints(stock)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=mixed_batches())
def test_mixed_batch_without_upper_bound_uses_exact_seq_lens(spec: BatchSpec):
    batch = _batch(spec, with_upper_bound=False)
    assert plugin_split(batch, decode_threshold=spec.threshold) == _oracle(spec)


def test_missing_upper_bound_warns_once(caplog_vllm):
    from vllm_rocm_aiter_plugin import split as split_module

    split_module._warned_missing_upper_bound = False
    batch = samples.make_batch([1, 5], [9, 5], with_upper_bound=False)
    for _ in range(3):
        assert plugin_split(batch) == (1, 0, 1, 1, 0, 5)
    warnings = {
        id(r): r for r in caplog_vllm.records if "seq_lens_cpu_upper_bound" in r.getMessage()
    }
    assert [r.levelname for r in warnings.values()] == ["WARNING"]


def test_no_row_above_threshold_is_all_decode():
    """max_query_len says mixed but no row is: every request is a decode (stock returns zeros)."""
    batch = samples.make_batch([1, 1, 1], [4, 5, 6], max_query_len=9, num_padding_tokens=2)
    assert plugin_split(batch) == (3, 0, 0, 5, 0, 0)


# ---- pure decode: no tensor op, no device-to-host copy --------------------------------------


class _SpyTensor(torch.Tensor):
    """Records every torch function applied to it (shape reads included)."""

    calls: list[str] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.calls.append(getattr(func, "__name__", repr(func)))
        return super().__torch_function__(func, types, args, kwargs or {})


def _spy_batch(query_lens, seq_lens, **kwargs):
    batch = samples.make_batch(query_lens, seq_lens, with_upper_bound=False, **kwargs)
    spied = {
        name: getattr(batch, name).as_subclass(_SpyTensor)
        for name in (
            "query_start_loc",
            "query_start_loc_cpu",
            "seq_lens",
            "block_table_tensor",
            "slot_mapping",
        )
    }
    return batch.replace(**spied)


@pytest.mark.parametrize("threshold, query_len", [(1, 1), (4, 4), (4, 2), (8, 5)])
def test_pure_decode_touches_no_tensor_data(threshold, query_len):
    batch = _spy_batch([query_len] * 5, [100 + i for i in range(5)])
    _SpyTensor.calls = []
    assert plugin_split(batch, decode_threshold=threshold) == (5, 0, 0, 5 * query_len, 0, 0)
    assert set(_SpyTensor.calls) <= {"__get__"}, _SpyTensor.calls  # shape reads only


def test_spy_sees_the_mixed_path_reading_tensors():
    """Control: the spy does record tensor reads, so the pure-decode test above can fail."""
    batch = _spy_batch([1, 5], [9, 5])
    _SpyTensor.calls = []
    plugin_split(batch)
    assert "cpu" in _SpyTensor.calls  # the host copy of seq_lens
    assert {"numpy", "tolist"} & set(_SpyTensor.calls)  # reading tensor data


def test_pure_decode_on_meta_device_tensors():
    """Device tensors on `meta`: any copy to the host would raise."""
    batch = samples.make_batch([4] * 3, [50, 60, 70], device="meta", with_upper_bound=False)
    assert plugin_split(batch, decode_threshold=4) == (3, 0, 0, 12, 0, 0)
    with pytest.raises(NotImplementedError):  # control: the mixed path must copy, and cannot
        plugin_split(samples.make_batch([1, 5], [9, 5], device="meta", with_upper_bound=False))


# ---- malformed input ---------------------------------------------------------------------


def test_threshold_below_one():
    with pytest.raises(ValueError, match="decode_threshold must be >= 1, got 0"):
        plugin_split(samples.make_batch([1], [5]), decode_threshold=0)


# Each malformed case runs on a small batch (the Python-int path) and behind 100 decode rows (the
# numpy path, for batches over split.SMALL_BATCH requests); rows in messages shift accordingly.
LEAD = pytest.mark.parametrize("lead", [0, 100], ids=["small-batch", "large-batch"])


def _lead(lead: int, query_lens: list[int], seq_lens: list[int], **kwargs):
    return samples.make_batch([1] * lead + query_lens, [10] * lead + seq_lens, **kwargs)


@LEAD
def test_query_start_loc_wrong_length(lead):
    batch = _lead(lead, [1, 5], [5, 6])
    batch = batch.replace(query_start_loc_cpu=batch.query_start_loc_cpu[:-1])
    n = lead + 2
    with pytest.raises(
        ValueError, match=rf"query_start_loc_cpu has {n} entries, expected num_reqs \+ 1 = {n + 1}"
    ):
        plugin_split(batch)


@LEAD
def test_query_start_loc_not_starting_at_zero(lead):
    batch = _lead(lead, [1, 5], [9, 5])
    batch = batch.replace(query_start_loc_cpu=batch.query_start_loc_cpu + 2)
    with pytest.raises(ValueError, match="query_start_loc_cpu must start at 0, got 2"):
        plugin_split(batch)


@LEAD
@pytest.mark.parametrize("long_row", [True, False], ids=["mixed", "no-long-row"])
def test_query_start_loc_decreasing(lead, long_row):
    batch = _lead(lead, [1, 5 if long_row else 1, 3], [9, 5, 3])
    offsets = batch.query_start_loc_cpu.clone()
    offsets[lead + 3] = offsets[lead + 2] - 2
    batch = batch.replace(query_start_loc_cpu=offsets, max_query_len=5)
    start = int(offsets[lead + 2])
    with pytest.raises(
        ValueError,
        match=f"query_start_loc_cpu decreases at request {lead + 2}: {start} -> {start - 2}",
    ):
        plugin_split(batch)


@LEAD
@pytest.mark.parametrize("with_upper_bound", [True, False])
def test_seq_len_smaller_than_query_len(lead, with_upper_bound):
    batch = _lead(lead, [1, 5, 6], [9, 20, 6], with_upper_bound=with_upper_bound)
    short = torch.tensor([10] * lead + [9, 3, 6], dtype=torch.int32)
    batch = batch.replace(
        seq_lens=short, **({"seq_lens_cpu_upper_bound": short} if with_upper_bound else {})
    )
    with pytest.raises(
        ValueError, match=rf"seq_lens\[{lead + 1}\] = 3 is smaller than its query length 5"
    ):
        plugin_split(batch)


@LEAD
def test_context_after_first_prefill(lead):
    batch = _lead(lead, [1, 6, 5, 4], [9, 6, 25, 4])
    with pytest.raises(
        ValueError,
        match=rf"request {lead + 2} has context .* after the first prefill \(request {lead + 1}\)",
    ):
        plugin_split(batch)


@settings(max_examples=300, deadline=None)
@given(spec=reordered_batches())
def test_every_reordered_batch_is_accepted(spec: BatchSpec):
    for with_upper_bound in (True, False):
        plugin_split(
            _batch(spec, with_upper_bound=with_upper_bound), decode_threshold=spec.threshold
        )


def _oracle_error(query_lens: list[int], seq_lens: list[int], threshold: int) -> str | None:
    """The first malformed row, by the documented order: offsets, then lengths, then layout."""
    for row, query_len in enumerate(query_lens):
        if query_len < 0:
            return f"query_start_loc_cpu decreases at request {row}"
    for row, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if seq_len < query_len:
            return f"seq_lens[{row}] = {seq_len} is smaller than its query length {query_len}"
    prefill = next(
        (
            r
            for r, (q, s) in enumerate(zip(query_lens, seq_lens, strict=True))
            if q > threshold and s == q
        ),
        None,
    )
    if prefill is not None:
        for row in range(prefill, len(query_lens)):
            if seq_lens[row] > query_lens[row]:
                return f"request {row} has context"
    return None


@st.composite
def arbitrary_batches(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    """Any rows at all, mostly well-formed: negative query lengths, short sequences, any order."""
    threshold = draw(st.integers(1, 4))
    n = draw(st.integers(1, 90))
    query_lens = draw(st.lists(st.integers(-1, 9), min_size=n, max_size=n))
    contexts = draw(st.lists(st.sampled_from([-2, 0, 0, 3, 50]), min_size=n, max_size=n))
    assume(max(query_lens) > threshold)
    return threshold, query_lens, [q + c for q, c in zip(query_lens, contexts, strict=True)]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=arbitrary_batches())
def test_both_paths_give_the_oracle_counts_or_its_first_error(case):
    """Valid or not, reordered or not: the Python-int and numpy paths agree with the oracle, on
    counts for well-formed batches and on the first malformed row for the rest."""
    threshold, query_lens, seq_lens = case
    offsets = [0]
    for q in query_lens:
        offsets.append(offsets[-1] + q)
    valid = samples.make_batch([1] * len(query_lens), [1] * len(query_lens))
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    fields = {"seq_lens_cpu_upper_bound": seq} if samples.has_seq_lens_upper_bound_field() else {}
    batch = valid.replace(
        query_start_loc_cpu=torch.tensor(offsets, dtype=torch.int32),
        seq_lens=seq,
        num_actual_tokens=max(offsets[-1], 0),
        max_query_len=max(query_lens),
        **fields,
    )
    error = _oracle_error(query_lens, seq_lens, threshold)
    for path in (split_module._split_small, split_module._split_mixed):
        if error is None:
            expected = oracle_split(query_lens, seq_lens, max(offsets[-1], 0), threshold)
            assert path(batch, threshold) == expected, path.__name__
        else:
            with pytest.raises(ValueError, match=re.escape(error)):
                path(batch, threshold)
