"""Recorders of a one-input module whose every call is flushed at once (one segment per call),
and a live writer beside a stopped one: the states of a store its readers and compaction meet.

`Add` is called with ``torch.ones(batch, 2)``: each batch size is its own signature. A stopped
writer's stats rollup is closed; a live writer's is open (it may still replace it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence

import torch

import capture

__all__ = ["Add", "record_flushed", "live_beside_stopped"]


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
