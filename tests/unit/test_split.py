"""The plugin's split against an independent oracle, against stock vLLM, and on malformed input."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from vllm.v1.attention.backends import utils as stock_utils

from tests.helpers.batches import ORDERS, mixed_batches, reordered_batches, v2_steps
from tests.helpers.depth import randomised
from tests.helpers.oracle import oracle_split
from vllm_rocm_aiter_plugin import split as split_module
from vllm_rocm_aiter_plugin.diagnostics import samples
from vllm_rocm_aiter_plugin.diagnostics.forward.cases import ForwardCase
from vllm_rocm_aiter_plugin.diagnostics.forward.steps import laid_out
from vllm_rocm_aiter_plugin.split import split_decodes_prefills_and_extends as plugin_split

needs_upper_bound_field = pytest.mark.skipif(
    not samples.has_seq_lens_upper_bound_field(),
    reason="this vLLM's CommonAttentionMetadata has no seq_lens_cpu_upper_bound field",
)


def _oracle(case: ForwardCase) -> tuple[int, ...]:
    query, seq, batch = laid_out(case)
    return oracle_split(query, seq, batch.num_actual_tokens, case.threshold)


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
    # Model-runner V2 order (ascending query length): rows with context after a new prompt.
    (
        "v2: new prompt before a continuation",
        1,
        [1, 50, 800],
        [901, 50, 8992],
        (1, 2, 0, 1, 850, 0),
    ),
    (
        "v2: prompts around a prefix-cache hit",
        1,
        [1, 20, 30, 40, 60],
        [90, 20, 1054, 40, 60],
        (1, 2, 2, 1, 50, 100),
    ),
    (
        "v2: short prompt in the decode region",
        4,
        [4, 2, 9, 12],
        [44, 2, 9, 80],
        (2, 2, 0, 6, 21, 0),
    ),
    ("v2: continuation then padded rows", 1, [3, 9, 0, 0], [3, 90, 0, 0], (0, 4, 0, 0, 12, 0)),
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


@randomised(3000)
@given(spec=reordered_batches())
def test_matches_oracle_on_reordered_batches(spec: ForwardCase):
    assert plugin_split(laid_out(spec)[2], decode_threshold=spec.threshold) == _oracle(spec)


@randomised(1500)
@given(spec=mixed_batches(max_rows_per_region=30), slack=st.integers(1, 5))
def test_an_overstated_upper_bound_moves_no_row(spec: ForwardCase, slack: int):
    """The regions come from the exact sequence lengths: an upper bound that overstates every row,
    rows without context included, changes nothing, so an extend region never lacks a row with
    context (which would give vLLM's extend path zero context chunks and crash it)."""
    query, seq, batch = laid_out(spec)
    if samples.has_seq_lens_upper_bound_field():
        batch = batch.replace(seq_lens_cpu_upper_bound=batch.seq_lens + slack)
    split = split_module.split_batch(batch, spec.threshold)
    assert split.counts == _oracle(spec)
    extend_rows = range(split.num_decodes, split.num_decodes + split.num_extends)
    if split.num_extends:
        assert any(seq[r] > query[r] for r in extend_rows)


@needs_upper_bound_field
@randomised(1500)
@given(spec=reordered_batches(max_rows_per_region=30))
def test_matches_installed_vllm_split_when_upper_bound_present(spec: ForwardCase):
    batch = laid_out(spec)[2]
    stock = stock_utils.split_decodes_prefills_and_extends(batch, decode_threshold=spec.threshold)
    assert plugin_split(batch, decode_threshold=spec.threshold) == _ints(stock)


@randomised(500)
@given(spec=mixed_batches())
def test_mixed_batch_without_upper_bound_uses_exact_seq_lens(spec: ForwardCase):
    import dataclasses

    batch = laid_out(dataclasses.replace(spec, with_upper_bound=False))[2]
    assert plugin_split(batch, decode_threshold=spec.threshold) == _oracle(spec)


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
    # query_start_loc_cpu and seq_lens (already on the host: read in place, no copy) are read.
    assert _SpyTensor.calls.count("numpy") == 2


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


# Each malformed case runs on a small batch and behind 100 decode rows; rows in messages shift.
LEAD = pytest.mark.parametrize("lead", [0, 100], ids=["small-batch", "large-batch"])


def _lead(lead: int, query_lens: list[int], seq_lens: list[int], **kwargs):
    return samples.make_batch([1] * lead + query_lens, [10] * lead + seq_lens, **kwargs)


@LEAD
def test_query_start_loc_wrong_length(lead):
    batch = _lead(lead, [1, 5], [5, 6])
    batch = batch.replace(query_start_loc_cpu=batch.query_start_loc_cpu[:-1])
    n = lead + 2
    with pytest.raises(
        ValueError,
        match=rf"query_start_loc_cpu must be 1-D with num_reqs \+ 1 = {n + 1} entries, "
        rf"got shape \({n},\)",
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
@pytest.mark.parametrize(
    "with_upper_bound", [pytest.param(True, marks=needs_upper_bound_field), False]
)
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
def test_context_after_a_prefill_goes_to_the_extend_region(lead):
    """A row with context after a new prompt (model-runner V2 order) is never a prefill: the
    prefill region starts after the last row with context."""
    batch = _lead(lead, [1, 6, 5, 4, 7], [9, 6, 25, 4, 7])
    assert plugin_split(batch) == (lead + 1, 2, 2, lead + 1, 11, 11)


@LEAD
def test_num_actual_tokens_below_last_offset(lead):
    batch = _lead(lead, [1, 5, 6], [9, 20, 6])
    batch = batch.replace(num_actual_tokens=lead + 11)
    with pytest.raises(
        ValueError,
        match=f"num_actual_tokens = {lead + 11} is smaller than the last query offset {lead + 12}",
    ):
        plugin_split(batch)


@LEAD
@pytest.mark.parametrize("field", ["query_start_loc_cpu", "seq_lens"])
def test_tensors_of_the_wrong_rank(lead, field):
    batch = _lead(lead, [1, 5, 6], [9, 20, 6])
    batch = batch.replace(**{field: getattr(batch, field)[None]})
    with pytest.raises(ValueError, match=rf"{field} must be 1-D with .* got shape \(1, \d+\)"):
        plugin_split(batch)


@LEAD
@needs_upper_bound_field
def test_the_upper_bound_is_never_read(lead):
    """Stock reads seq_lens_cpu_upper_bound; the plugin reads the exact lengths, so even an upper
    bound of the wrong rank changes nothing."""
    batch = _lead(lead, [1, 5, 6], [9, 20, 6])
    batch = batch.replace(seq_lens_cpu_upper_bound=batch.seq_lens_cpu_upper_bound[None])
    assert plugin_split(batch) == oracle_split([1] * lead + [1, 5, 6], [10] * lead + [9, 20, 6],
                                               lead + 12, 1)  # fmt: skip


@pytest.mark.parametrize("threshold", [2**31 - 1, 2**31, 2**63, 10**30])
@pytest.mark.parametrize("lead", [0, 100], ids=["small-batch", "large-batch"])
def test_huge_thresholds_give_all_decodes(lead, threshold):
    batch = _lead(lead, [1, 5, 6], [9, 20, 6], max_query_len=10**31)
    assert plugin_split(batch, threshold) == (lead + 3, 0, 0, lead + 12, 0, 0)


def _oracle_error(query_lens: list[int], seq_lens: list[int], num_tokens: int) -> str | None:
    """The first problem, by the documented order: offsets, token count, then lengths."""
    for row, query_len in enumerate(query_lens):
        if query_len < 0:
            return f"query_start_loc_cpu decreases at request {row}"
    if sum(query_lens) > num_tokens:
        return f"num_actual_tokens = {num_tokens} is smaller than the last query offset"
    for row, (query_len, seq_len) in enumerate(zip(query_lens, seq_lens, strict=True)):
        if seq_len < query_len:
            return f"seq_lens[{row}] = {seq_len} is smaller than its query length {query_len}"
    return None


@st.composite
def arbitrary_batches(draw: st.DrawFn) -> tuple[int, list[int], list[int], int]:
    """Any rows at all, mostly well-formed: negative query lengths, short sequences, any order,
    too few or padded tokens, thresholds up to beyond any integer dtype."""
    threshold = draw(st.one_of(st.integers(1, 4), st.sampled_from([2**31, 2**63, 10**20])))
    n = draw(st.integers(1, 90))
    query_lens = draw(st.lists(st.integers(-1, 9), min_size=n, max_size=n))
    contexts = draw(st.lists(st.sampled_from([-2, 0, 0, 3, 50]), min_size=n, max_size=n))
    num_tokens = max(sum(query_lens), 0) + draw(st.sampled_from([0, 0, 0, 3, -1]))
    return (
        threshold,
        query_lens,
        [q + c for q, c in zip(query_lens, contexts, strict=True)],
        max(num_tokens, 0),
    )


@randomised(2000)
@given(case=arbitrary_batches())
def test_the_oracle_counts_or_its_first_error(case):
    """Valid or not, in any order: the split agrees with the oracle, on counts for well-formed
    batches and on the first problem for the rest."""
    threshold, query_lens, seq_lens, num_tokens = case
    offsets = [0]
    for q in query_lens:
        offsets.append(offsets[-1] + q)
    valid = samples.make_batch([1] * len(query_lens), [1] * len(query_lens))
    seq = torch.tensor(seq_lens, dtype=torch.int32)
    fields = {"seq_lens_cpu_upper_bound": seq} if samples.has_seq_lens_upper_bound_field() else {}
    batch = valid.replace(
        query_start_loc_cpu=torch.tensor(offsets, dtype=torch.int32),
        seq_lens=seq,
        num_actual_tokens=num_tokens,
        max_query_len=max(query_lens),
        **fields,
    )
    error = _oracle_error(query_lens, seq_lens, num_tokens)
    if max(query_lens) <= threshold:  # max_query_len says pure decode: nothing is read
        expected, error = (len(query_lens), 0, 0, num_tokens, 0, 0), None
    elif error is None and not any(q > threshold for q in query_lens):
        expected = (len(query_lens), 0, 0, num_tokens, 0, 0)
    elif error is None:
        expected = oracle_split(query_lens, seq_lens, num_tokens, threshold)
    elif error.startswith("seq_lens") and not any(q > threshold for q in query_lens):
        expected, error = (len(query_lens), 0, 0, num_tokens, 0, 0), None  # lengths never read
    if error is None:
        assert plugin_split(batch, threshold) == expected
    else:
        with pytest.raises(ValueError, match=re.escape(error)):
            plugin_split(batch, threshold)


@randomised(3000)
@given(step=v2_steps(max_requests=40))
def test_v2_ordered_steps_match_the_oracle(step: ForwardCase):
    """Steps in model-runner V2 order (the installed vLLM's sort): the oracle's regions, which
    never put a row with context in the prefill region."""
    query, seq, batch = laid_out(step, "v2")
    expected = oracle_split(query, seq, batch.num_actual_tokens, step.threshold)
    assert plugin_split(batch, decode_threshold=step.threshold) == expected
    first_prefill = expected[0] + expected[1]
    assert all(s == q for q, s in zip(query[first_prefill:], seq[first_prefill:], strict=True))


@needs_upper_bound_field
@randomised(2000)
@given(step=v2_steps(max_requests=40))
def test_v2_ordered_steps_equal_stock_wherever_stock_keeps_context(step: ForwardCase):
    """Stock's counts wherever stock puts no row with context in its prefill region; elsewhere
    the plugin's prefill region is stock's minus the rows stock got wrong."""
    query, seq, batch = laid_out(step, "v2")
    stock = _ints(stock_utils.split_decodes_prefills_and_extends(batch, step.threshold))
    plugin = plugin_split(batch, decode_threshold=step.threshold)
    stock_prefill = stock[0] + stock[1]
    if all(s == q for q, s in zip(query[stock_prefill:], seq[stock_prefill:], strict=True)):
        assert plugin == stock
    else:
        assert plugin[0] == stock[0] and plugin[2] < stock[2]


@needs_upper_bound_field
@randomised(600)
@given(step=v2_steps(max_requests=40), order=st.sampled_from(ORDERS))
def test_non_causal_batches_get_stocks_regions_in_any_order(step: ForwardCase, order: str):
    """vLLM 0.33 builds non-causal decoder batches (``causal=False``). The extend path runs
    causally whatever the batch says, so moving a context-free row there would make it wrong
    where stock's prefill kernel is right, and a row with context gains nothing: the plugin
    gives stock's regions, in model-runner V2 order and in V1 order (where the installed vLLM
    has the V1 runner: ``ORDERS``)."""
    import dataclasses

    batch = dataclasses.replace(laid_out(step, order)[2], causal=False)
    stock = _ints(stock_utils.split_decodes_prefills_and_extends(batch, step.threshold))
    assert plugin_split(batch, decode_threshold=step.threshold) == stock
    own = split_module.split_batch(batch, step.threshold)
    assert own.counts == stock


def test_non_causal_control_the_causal_rule_differs_from_stock():
    """Control: the same V2-order step, causal, is one where the plugin's regions differ from
    stock's (a long row with context after a context-free one), so the test above can fail."""
    import dataclasses

    batch = samples.make_batch([1, 50, 800], [901, 50, 8992])
    stock = _ints(stock_utils.split_decodes_prefills_and_extends(batch, 1))
    assert plugin_split(batch, decode_threshold=1) != stock
    non_causal = dataclasses.replace(batch, causal=False)
    assert plugin_split(non_causal, decode_threshold=1) == stock


@needs_upper_bound_field
@randomised(2000)
@given(step=v2_steps(max_requests=40), order=st.sampled_from(ORDERS))
def test_the_exposure_count_is_the_rows_stocks_own_split_serves_without_their_context(
    step: ForwardCase, order: str
):
    """The steps as vLLM's own sort (and its V1 reorder, where it has one) lay them out: the count
    equals the rows with context from stock's prefill region on, found by running stock's split,
    and their cached tokens; in V1 order it is 0."""
    query, seq, batch = laid_out(step, order)
    stock = _ints(stock_utils.split_decodes_prefills_and_extends(batch, step.threshold))
    start = stock[0] + stock[1] if stock[2] else len(query)
    lost = [s - q for q, s in zip(query[start:], seq[start:], strict=True) if s > q]
    split = split_module.split_batch(batch, step.threshold)
    assert (split.exposed_requests, split.exposed_context_tokens) == (len(lost), sum(lost))
    if order == "v1":
        assert split.exposed_requests == 0


def test_the_exposure_count_on_the_readmes_example_and_its_controls():
    """The README's step: one request, 8192 tokens. None on pure decode, without the upper bound
    (stock's split asserts it) or on a non-causal batch."""
    batch = samples.make_batch([1, 50, 800], [901, 50, 8992])
    split = split_module.split_batch(batch, 1)
    assert (split.exposed_requests, split.exposed_context_tokens) == (1, 8192)
    for control in (
        samples.make_batch([1, 1], [901, 50]),
        samples.make_batch([1, 50, 800], [901, 50, 8992], with_upper_bound=False),
        dataclasses.replace(batch, causal=False),
    ):
        assert split_module.split_batch(control, 1).exposed_requests == 0
