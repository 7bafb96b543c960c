"""The recording options: what a `Recorder` records and how it writes, checked once.

`RecorderOptions` is frozen and validated when it is built, so a recorder, its sub-module
recorders (``modules=``) and any number of recorders configured alike share one object; a bad
value raises a `CaptureError` naming the option at construction, never at ``start()``.
`Payloads` is the ``payloads=`` option with its caps. This module does not import torch (checking
that safetensors is installed, when payloads are on, does).
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from capture.errors import CaptureError
from capture.store.payload_files import require_safetensors
from capture.store.payload_format import DEFAULT_MAX_CALL_BYTES

__all__ = ["RecorderOptions", "Payloads", "payload_policy", "VALUE_RANGES"]

VALUE_RANGES = ("cpu", "all", "none")
"""The values of the ``value_ranges`` option."""

_MiB = 2**20


@dataclass(frozen=True)
class Payloads:
    """What ``Recorder(..., payloads=...)`` keeps of real calls (a float means ``Payloads(rate)``).

    Attributes:
        rate: Fraction of the recorded calls whose tensors are kept (0 turns payloads off).
        max_call_bytes: Largest payload of one call (inputs; outputs are kept when they still
            fit); a bigger call keeps nothing and is counted.
        max_store_bytes: Payload bytes the store may hold; once used, no more are kept.
        max_pending: Sampled calls waiting for the payload writer; beyond, dropped and counted.
    """

    rate: float
    max_call_bytes: int = DEFAULT_MAX_CALL_BYTES
    max_store_bytes: int = 1024 * _MiB
    max_pending: int = 8


def payload_policy(value: float | Payloads | None) -> Payloads | None:
    """The `Payloads` of a ``payloads=`` option; None when off.

    Raises:
        CaptureError: The rate or a cap is out of range, or safetensors is not installed.
    """
    if value is None or (not isinstance(value, Payloads) and value == 0):
        return None
    if isinstance(value, Payloads):
        policy = value
    else:
        try:
            policy = Payloads(rate=float(value))
        except (TypeError, ValueError) as e:
            raise CaptureError(
                f"payloads={value!r} must be a rate within [0, 1] or a capture.Payloads(rate, ...)"
            ) from e
    if not 0.0 <= policy.rate <= 1.0:
        raise CaptureError(f"payloads rate {policy.rate!r} must be within [0, 1]")
    for name in ("max_call_bytes", "max_store_bytes", "max_pending"):
        if getattr(policy, name) <= 0:
            raise CaptureError(f"Payloads.{name}={getattr(policy, name)!r} must be positive")
    if policy.rate == 0:
        return None
    require_safetensors()
    return policy


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class RecorderOptions:
    """What a `capture.Recorder` records and how it writes it (its keyword options, as one object).

    ``Recorder(model, store, sample=0.1)`` builds one from its keywords;
    ``Recorder(model, store, options=opts)`` takes one whole, and keywords passed beside it
    replace those fields (``Recorder(m, s, options=opts, sample=1.0)``). Sub-module recorders
    (``modules=``) share their parent's object.

    Attributes:
        sample: Fraction of calls recorded (1.0 records all of them).
        max_calls: Stop recording after this many recorded calls (None: no limit).
        record_outputs: Also record the structure and sizes of what the method returns.
        value_ranges: Min/max of integer tensors: 'cpu' (CPU tensors only: on CUDA it forces a
            sync), 'all', or 'none'.
        queue_size: Calls buffered between the model and the writer thread; beyond, dropped.
        flush_rows: Rows per written segment.
        flush_seconds: Longest time a recorded call waits before being written.
        max_structures: Distinct structures kept; calls with a new structure beyond this are
            dropped and counted (a scalar argument that changes every call would otherwise
            grow the cache without bound).
        payloads: Keep the real tensors (inputs, and outputs when they fit) of this fraction
            of the recorded calls, as safetensors files in the store's ``payloads/`` folder,
            or a `capture.Payloads` with its caps (per call, default 16 MiB;
            per store, default 1 GiB). **These are user data**: off (0) by default; see the
            README's "Payloads" section for what is kept and how to delete it. Needs the
            ``safetensors`` package (``capture[payloads]``).
        compiled: Record the calls of a `torch.compile`d model: the compiled caller breaks its
            graph at the recorder, which runs eagerly around the compiled method. False: a
            compile traces through the recorder and its calls are not recorded (what
            ``fullgraph=True`` needs: there a graph break is an error).
        state: A callable returning the state a call runs under, beyond what the recorder reads
            itself (peft adapters, ``training``): a dict of a few scalars (str -> bool, int,
            float or str), called before each recorded call. Calls of different states are
            never one call group, and ``replay.export`` exports each state (its ``set_state=``
            enters one). A call whose state cannot be read is counted in ``errors`` and not
            recorded (`capture.state`).

    Raises:
        CaptureError: An option is out of range or of the wrong type (the message names it),
            or payloads are asked for and safetensors is not installed.
    """

    sample: float = 1.0
    max_calls: int | None = None
    record_outputs: bool = True
    value_ranges: str = "cpu"
    queue_size: int = 100_000
    flush_rows: int = 100_000
    flush_seconds: float = 10.0
    max_structures: int = 10_000
    payloads: float | Payloads = 0.0
    compiled: bool = True
    state: Callable[[], Any] | None = None
    payload_policy: Payloads | None = field(init=False, repr=False, compare=False)
    """The `Payloads` that ``payloads`` asks for; None when payloads are off."""

    def __post_init__(self) -> None:
        if not _is_number(self.sample):
            raise CaptureError(f"sample={self.sample!r} must be a number within [0, 1]")
        if not 0.0 <= self.sample <= 1.0:
            raise CaptureError(f"sample={self.sample!r} must be within [0, 1]")
        if self.max_calls is not None and not (_is_int(self.max_calls) and self.max_calls >= 0):
            raise CaptureError(
                f"max_calls={self.max_calls!r} must be a count >= 0, or None for no limit"
            )
        if self.value_ranges not in VALUE_RANGES:
            raise CaptureError(f"value_ranges={self.value_ranges!r} must be one of {VALUE_RANGES}")
        for name in ("queue_size", "flush_rows", "max_structures"):
            value = getattr(self, name)
            if not (_is_int(value) and value >= 1):
                raise CaptureError(f"{name}={value!r} must be a whole number >= 1")
        if not (_is_number(self.flush_seconds) and self.flush_seconds >= 0):
            raise CaptureError(
                f"flush_seconds={self.flush_seconds!r} must be a number of seconds >= 0"
            )
        if self.state is not None and not callable(self.state):
            raise CaptureError(
                f"state={self.state!r} must be a callable returning a dict of a few scalars"
            )
        # Raises now, not at start(), on a bad payloads option or a missing safetensors.
        object.__setattr__(self, "payload_policy", payload_policy(self.payloads))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The options' names (the keywords ``Recorder`` accepts for them)."""
        return tuple(f.name for f in fields(cls) if f.init)

    def with_keywords(self, keywords: dict[str, Any]) -> RecorderOptions:
        """These options with the fields `keywords` names replaced (self when it names none).

        Raises:
            CaptureError: A keyword names no option (the message suggests the closest one).
        """
        if not keywords:
            return self
        names = self.names()
        for key in keywords:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise CaptureError(
                    f"Recorder has no option {key!r}; {hint}its options are {', '.join(names)}"
                )
        return replace(self, **keywords)
