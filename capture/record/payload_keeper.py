"""Keeps the real tensors of a sampled few recorded calls (``Recorder(..., payloads=RATE)``).

**Payloads are user data**: prompts, images, whatever the model was sent. They are off by default;
turn them on only where keeping production inputs on disk is allowed, and remove them
(`capture.store.payload_files.delete_payloads`, ``capture payloads --delete-before DATE``) when
done.

On the hot path, only for a sampled call (``random() < rate``, drawn after the recorder's own
``sample``): torch's pytree flattens ``(args, kwargs)``, the tensors' byte sizes are summed and
checked against the caps, and each tensor is copied (``detach`` + copy to contiguous CPU memory)
*before* forward, since forward may change its inputs in place (a static cache). After forward
the returned tensors are copied the same way, if they still fit the per-call cap. Copies never
touch the model's own tensors, so results are unchanged. A copy of a CUDA tensor waits for the
GPU (a sync): that is the price of a sampled call, paid only by sampled calls.

A dedicated thread writes the copies in the safetensors format, one complete file per call (tmp name
+ rename, `capture.store.payload_files`); at most `Payloads.max_pending` calls wait for it, beyond
that a sampled call is dropped and counted. Every skip is counted in `PayloadKeeper.stats`:

- ``payloads_oversize``: the call's input tensors exceed ``max_call_bytes``;
- ``payloads_over_budget``: the store's payloads would exceed ``max_store_bytes`` (what the
  store's payloads/ folder held when the recorder started, plus what this recorder kept; other
  processes writing at the same time are not seen until they restart);
- ``payloads_dropped``: the writer was busy or a write failed.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import queue
import random
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from capture.record.recorder_options import Payloads
from capture.store.payload_files import (
    PAYLOAD_VERSION,
    SUFFIX,
    list_payloads,
    payload_folder,
)
from capture.store.payload_format import DTYPES

__all__ = ["PayloadKeeper"]

logger = logging.getLogger(__name__)

# safetensors dtype names (capture.store.payload_format, what readers accept); a call with
# another dtype keeps no payload.
_DTYPES = {getattr(torch, name): code for code, (name, _) in DTYPES.items() if hasattr(torch, name)}


def _safetensors_layout(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str]
) -> tuple[bytes, list[Any]]:
    """(length prefix + JSON header, the tensors' raw bytes in order) of a safetensors file.

    The format (github.com/huggingface/safetensors): an 8-byte little-endian header size, a
    JSON header giving each tensor's dtype, shape and [begin, end) byte offsets into the data
    that follows (contiguous, in order), and ``__metadata__``; padded with spaces to 8 bytes.
    Written here rather than with ``safetensors.torch.save``, which builds the whole file as
    one bytes object while holding the GIL (tens of ms for a few MB: the serving threads would
    wait); the tests read these files back with the safetensors package.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    buffers = []
    offset = 0
    for name, t in tensors.items():
        data = t.reshape(-1).view(torch.uint8).numpy()  # little-endian, as safetensors wants
        header[name] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + data.nbytes],
        }
        offset += data.nbytes
        buffers.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, buffers


def _nbytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy sharing no memory with `t` (safetensors needs contiguous data)."""
    return t.detach().to(device="cpu", memory_format=torch.contiguous_format, copy=True)


@dataclass
class _Kept:
    ts_ns: int
    in_structure: str
    tensors: dict[str, torch.Tensor]
    nbytes: int
    outputs: str = "not recorded"
    call_id: int = -1
    state: str | None = None


class PayloadKeeper:
    """Samples calls, copies their tensors and writes them on its own thread."""

    def __init__(self, policy: Payloads, store: str | os.PathLike[str], model_name: str) -> None:
        from capture.store.files import resolve_store, safe_name

        self.policy = policy
        self.model_name = model_name
        self.fs, self.root = resolve_store(store)
        self._model_part = safe_name(model_name)
        self._host_part = safe_name(os.uname().nodename if hasattr(os, "uname") else "host")
        self._thread: threading.Thread | None = None
        self._fresh()

    def _fresh(self) -> None:
        """A new file prefix, queue, lock and counters (at init, and in a forked child)."""
        self._prefix = f"{self._host_part}-{os.getpid()}-{time.time_ns() // 1000:x}"
        self._random = random.Random().random
        self._queue: queue.Queue[_Kept | None] = queue.Queue(maxsize=self.policy.max_pending)
        self._lock = threading.Lock()
        self._used = 0
        self.kept = 0
        self.bytes_written = 0
        self.oversize = 0
        self.over_budget = 0
        self.dropped = 0
        self._warned = False

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        """Reads how much the store's payloads use, then starts the writer thread."""
        try:
            self._used = sum(p.size for p in list_payloads((self.fs, self.root)))
        except Exception as e:  # an unreadable store: the Parquet writer reports it too
            self._warn(f"listing the payloads of {self.root} ({e})")
        self._thread = threading.Thread(
            target=self._run, name=f"capture-payloads-{self.model_name}", daemon=True
        )
        self._thread.start()

    def after_fork_in_child(self) -> None:
        """In a forked child: its own file prefix, an empty queue and a new writer thread.

        The parent's thread does not exist in the child: without this, the child's sampled
        calls filled a queue nobody drained and were all dropped. The payloads queued before
        the fork are the parent's to write.
        """
        running = self._thread is not None
        self._thread = None
        self._fresh()
        if running:
            self.start()

    def close(self, timeout: float | None = 30.0) -> None:
        """Writes what is queued and stops the thread."""
        if self._thread is None:
            return
        self._queue.put(None)  # blocks only while the queue is full: it drains
        self._thread.join(timeout=timeout)
        self._thread = None

    def stats(self) -> dict[str, int]:
        """Counters: payloads (files written), payloads_oversize, _over_budget, _dropped."""
        return {
            "payloads": self.kept,
            "payloads_oversize": self.oversize,
            "payloads_over_budget": self.over_budget,
            "payloads_dropped": self.dropped,
        }

    # -- hot path (sampled calls only past the first line) -----------------------------------
    def take(
        self,
        args: Any,
        kwargs: Any,
        in_structure: str,
        keywords: tuple[str, ...] | None = None,
        state: str | None = None,
    ) -> _Kept | None:
        """Copies the input tensors of a sampled call (None: not sampled, or skipped);
        `keywords` is the structure's keyword order when the call passed another one, `state`
        the call's state key (`capture.state`), kept in the file's metadata."""
        if self._random() >= self.policy.rate:
            return None
        if self._thread is None or self._queue.full():
            self.dropped += 1
            return None
        if keywords is not None:  # leaves numbered in the structure's order
            kwargs = {name: kwargs[name] for name in keywords}
        flat = pytree.tree_leaves((args, kwargs))
        found = {i: t for i, t in enumerate(flat) if isinstance(t, torch.Tensor)}
        if any(t.dtype not in _DTYPES for t in found.values()):
            self.dropped += 1  # complex and other dtypes safetensors has no name for
            return None
        nbytes = _nbytes(list(found.values()))
        if nbytes > self.policy.max_call_bytes:
            self.oversize += 1
            return None
        if self._used + nbytes > self.policy.max_store_bytes:
            self.over_budget += 1
            return None
        copies = {f"in/{i}": _copy(t) for i, t in found.items()}
        return _Kept(time.time_ns(), in_structure, copies, nbytes, state=state)

    def finish(self, kept: _Kept, call_id: int | None, out: Any) -> None:
        """Adds the call's outputs (when they fit) and queues the payload for writing."""
        if call_id is None:
            return
        kept.call_id = call_id
        flat = pytree.tree_leaves(out)
        outs = {i: t for i, t in enumerate(flat) if isinstance(t, torch.Tensor)}
        out_bytes = _nbytes(list(outs.values()))
        total = kept.nbytes + out_bytes
        if any(t.dtype not in _DTYPES for t in outs.values()):
            kept.outputs = "not kept: a dtype safetensors cannot hold"
        elif total > self.policy.max_call_bytes:
            kept.outputs = "not kept: over max_call_bytes"
        elif self._used + total > self.policy.max_store_bytes:
            kept.outputs = "not kept: over max_store_bytes"
        else:
            kept.tensors.update({f"out/{i}": _copy(t) for i, t in outs.items()})
            kept.outputs = "kept"
            kept.nbytes = total
        with self._lock:
            if self._used + kept.nbytes > self.policy.max_store_bytes:
                self.over_budget += 1
                return
            self._used += kept.nbytes
        try:
            self._queue.put_nowait(kept)
        except queue.Full:
            with self._lock:
                self._used -= kept.nbytes
            self.dropped += 1

    # -- writer thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            kept = self._queue.get()
            if kept is None:
                return
            try:
                self._write(kept)
                self.kept += 1
            except Exception as e:  # never let the thread die: count, warn once, go on
                self.dropped += 1
                self._warn(f"writing a payload to {self.root} ({type(e).__name__}: {e})")

    def _write(self, kept: _Kept) -> None:
        from capture.store.files import library_version

        metadata = {
            "capture.kind": "payload",
            "capture.payload_version": str(PAYLOAD_VERSION),
            "capture.library_version": library_version(),
            "model": self.model_name,
            "call_id": str(kept.call_id),
            "ts_ns": str(kept.ts_ns),
            "in_structure": kept.in_structure,
            "outputs": kept.outputs,
            # the default state (None) writes no key: files read as before states were
            **({"state": kept.state} if kept.state is not None else {}),
        }
        header, buffers = _safetensors_layout(kept.tensors, metadata)
        day = dt.datetime.fromtimestamp(kept.ts_ns / 1e9, dt.timezone.utc).date().isoformat()
        folder = payload_folder(self.root, self._model_part, day)
        name = f"{self._prefix}-{kept.call_id & (2**64 - 1):016x}{SUFFIX}"
        self.fs.create_dir(folder, recursive=True)
        tmp, final = f"{folder}/.{name}.tmp", f"{folder}/{name}"
        try:
            with self.fs.open_output_stream(tmp) as sink:
                sink.write(header)
                for buffer in buffers:
                    sink.write(buffer)  # pyarrow writes without holding the GIL
            self.fs.move(tmp, final)
        except BaseException:
            try:
                self.fs.delete_file(tmp)
            except Exception:  # the temporary file may not exist; the original error matters
                pass
            raise
        self.bytes_written += len(header) + sum(b.nbytes for b in buffers)

    def _warn(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "capture: failed %s; the model keeps running, further payload failures are "
                "counted in stats()['payloads_dropped']",
                what,
            )
