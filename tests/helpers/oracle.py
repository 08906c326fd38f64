"""Independent oracles, written from the documented rules in plain Python (no plugin code)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def oracle_split(
    query_lens: Sequence[int],
    seq_lens: Sequence[int],
    num_actual_tokens: int,
    threshold: int,
    max_query_len: int | None = None,
) -> tuple[int, int, int, int, int, int]:
    """Decodes: rows before the first query longer than the threshold. Prefills: from the first
    long row without context after the last row with context. Extends: the rows in between.
    Padding tokens (``num_actual_tokens`` past the last offset) go to the last non-empty group."""
    n = len(query_lens)
    if max_query_len is None:
        max_query_len = max(query_lens, default=0)
    if max_query_len <= threshold or all(q <= threshold for q in query_lens):
        return n, 0, 0, num_actual_tokens, 0, 0
    first_long = next(r for r in range(n) if query_lens[r] > threshold)
    rows_with_context = [r for r in range(n) if seq_lens[r] > query_lens[r]]
    after_context = max(rows_with_context, default=-1) + 1
    first_prefill = next(
        (r for r in range(max(first_long, after_context), n) if query_lens[r] > threshold), n
    )
    decode_tokens = sum(query_lens[:first_long])
    extend_tokens = sum(query_lens[first_long:first_prefill])
    prefill_tokens = sum(query_lens[first_prefill:])
    padding = num_actual_tokens - (decode_tokens + extend_tokens + prefill_tokens)
    if first_prefill < n:
        prefill_tokens += padding
    else:
        extend_tokens += padding
    return (
        first_long,
        first_prefill - first_long,
        n - first_prefill,
        decode_tokens,
        extend_tokens,
        prefill_tokens,
    )


@dataclass(frozen=True)
class RowAttention:
    """What one request's query tokens attend to."""

    tokens: tuple[int, int]
    context: tuple[tuple[int, int], ...]
    causal_new: bool


def true_attention(query_lens: Sequence[int], seq_lens: Sequence[int]) -> list[RowAttention]:
    """The truth for a causal decoder: every cached token of the request, then its new tokens
    causally. Requests with no query token attend to nothing."""
    rows, start = [], 0
    for query_len, seq_len in zip(query_lens, seq_lens, strict=True):
        context = seq_len - query_len
        rows.append(_row(start, query_len, ((0, context),) if context else ()))
        start += query_len
    return rows


def attention_from_metadata(meta: Any) -> list[RowAttention]:
    """Per request, what ``AiterFlashAttentionImpl.forward`` attends to with this metadata."""
    rows: list[RowAttention] = []
    qsl = meta.query_start_loc.cpu().tolist()
    seq_lens = meta.seq_lens.cpu().tolist()
    num_decodes, num_extends, num_prefills = meta.num_decodes, meta.num_extends, meta.num_prefills
    decode_end_token = meta.num_decode_tokens
    extend_end_token = decode_end_token + meta.num_extend_tokens

    for row in range(num_decodes):
        query_len = qsl[row + 1] - qsl[row]
        assert qsl[row + 1] <= decode_end_token, f"decode row {row} runs past the decode tokens"
        context = seq_lens[row] - query_len
        rows.append(_row(qsl[row], query_len, ((0, context),) if context > 0 else ()))

    if num_extends:
        extend = meta.extend_metadata
        local = extend.query_start_loc.cpu().tolist()
        chunks = extend.chunk_context_metadata
        cu_chunk = chunks.cu_seq_lens_chunk.cpu().tolist()
        starts = chunks.chunk_starts.cpu().tolist()
        assert len(local) == num_extends + 1 and local[0] == 0
        for j in range(num_extends):
            ranges = []
            for c in range(chunks.num_chunks):
                length = cu_chunk[c][j + 1] - cu_chunk[c][j]
                if length > 0:
                    ranges.append((starts[c][j], starts[c][j] + length))
            start = decode_end_token + local[j]
            query_len = local[j + 1] - local[j]
            assert start + query_len <= extend_end_token, f"extend row {j} runs past its tokens"
            rows.append(_row(start, query_len, _merge(ranges)))

    if num_prefills:
        local = meta.prefill_metadata.query_start_loc.cpu().tolist()
        assert len(local) == num_prefills + 1 and local[0] == 0
        for j in range(num_prefills):
            rows.append(_row(extend_end_token + local[j], local[j + 1] - local[j], ()))
    return rows


def _row(start: int, query_len: int, context: tuple[tuple[int, int], ...]) -> RowAttention:
    if query_len <= 0:
        return RowAttention((start, start), (), False)  # no query token: attends to nothing
    return RowAttention((start, start + query_len), context, True)


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


def rows_attending_wrongly(
    meta: Any, query_lens: Sequence[int], seq_lens: Sequence[int]
) -> list[int]:
    """The requests whose attention under ``meta`` differs from the truth."""
    got = attention_from_metadata(meta)
    want = true_attention(query_lens, seq_lens)
    assert len(got) == len(want), f"metadata covers {len(got)} requests, batch has {len(want)}"
    return [row for row, (g, w) in enumerate(zip(got, want, strict=True)) if g != w]
