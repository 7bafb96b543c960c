"""Recorders of a one-input module whose every call is flushed at once (one segment per call),
and a live writer beside a stopped one: the states of a store its readers and compaction meet.

`Add` is called with ``torch.ones(batch, 2)``: each batch size is its own signature. A stopped
writer's stats rollup is closed; a live writer's is open (it may still replace it).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow.parquet as pq
import torch

import capture
from capture import schema

__all__ = ["Add", "record_flushed", "live_beside_stopped", "stage_uncommitted_segment"]


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


def record_flushed(root: str | os.PathLike[str], batches: Sequence[int]) -> capture.Recorder:
    """One call of a new `Add` per batch size (model ``add``), each flushed, then stopped."""
    model = Add()
    with capture.Recorder(model, root, name="add", flush_seconds=3600) as rec:
        for b in batches:
            model(torch.ones(b, 2))
            rec.flush()
    return rec


@contextlib.contextmanager
def live_beside_stopped(root: str | os.PathLike[str]) -> Iterator[capture.Recorder]:
    """A running recorder that flushed two calls (batches 1 and 2) beside a stopped writer's
    one call (batch 3), in one store; the running one stops when the block ends."""
    model = Add()
    rec = capture.Recorder(model, root, name="add", flush_seconds=3600)
    rec.start()
    try:
        for b in (1, 2):
            model(torch.ones(b, 2))
            rec.flush()
        record_flushed(root, [3])
        yield rec
    finally:
        rec.stop()


def stage_uncommitted_segment(root: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Records two flushed calls, then stages a second rollup naming a segment that spans
    midnight: its first day's calls file landed, its second day's never did. Returns (the
    staged rollup, the landed calls file): readers count neither until the segment commits."""
    store = Path(root)
    record_flushed(store, [1, 2])
    (rollup,) = sorted((store / schema.STATS).rglob("*.parquet"))
    last = sorted((store / schema.CALLS).rglob("*.parquet"))[-1]
    day = last.parent.name.removeprefix("date=")
    table = pq.read_table(rollup)
    meta = {
        **(table.schema.metadata or {}),
        schema.METADATA_SEGMENT_CALLS: json.dumps({day: 1, "2001-01-01": 1}).encode(),
    }
    staged = rollup.with_name("w-000009.parquet")
    pq.write_table(table.replace_schema_metadata(meta), staged)
    landed = last.with_name(staged.name)
    landed.write_bytes(last.read_bytes())
    return staged, landed
