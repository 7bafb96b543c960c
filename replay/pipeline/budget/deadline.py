"""torch.export stopped at a deadline, in this process, from any thread.

torch.export spends its long runs in Python: sympy's value-range analysis, the symbolic-shape
machinery, the tracer. `call_within` runs the export in the calling thread while a watchdog
thread waits for the deadline; at the deadline the watchdog raises `DeadlineReached` in the
exporting thread (CPython's ``PyThreadState_SetAsyncExc``). `DeadlineReached` is a
`BaseException`, not an `Exception`: torch's ``except Exception`` handlers neither swallow it
nor turn it into another error, while its ``with`` blocks and ``finally`` clauses run as it
unwinds and put back the state torch set.

Where it is raised matters. The interpreter raises such an exception at the thread's next check
for pending work, which may be in a Python function that C++ code calls: torch's C++ calls
some (``find_torch_dispatch_rule``) where a Python exception ends the process
(``std::terminate``). So the watchdog raises it only at a point it can see (polling every few
milliseconds, after the deadline): the exporting thread waits at a loop's back-jump in its
innermost frame, where the interpreter raises it in that very frame (elsewhere the thread may
be in C code that released the GIL and will call Python next); and no frame between there and
`call_within` runs a context manager's ``__enter__`` or ``__exit__`` (where torch sets and
restores its global state), module code (an import half done would stay half done), a
finalizer or a garbage-collector callback (which cannot raise), the standard library (a lock
taken or a file opened, then released in a ``try`` the exception could skip) or the torch code
of `_TORCH_UNSAFE`. Such points come within milliseconds in a long export (a few % of samples
on the tiny Swin of `bench/bench_budget.py` are at a safe back-jump, and the watchdog looks
every few milliseconds). A delivery that lands where Python cannot raise it all the same (a
loop in a garbage-collector callback) is dropped from ``sys.unraisablehook`` and raised again.
After an export stopped at its deadline, `replay.pipeline.budget.torchstate.TorchState`
compares the process-wide state torch sets with what it was before the export and puts back
what differs (and the error names it), so the next export starts clean.

Guarantees of `call_within`: the exception is raised only while the guarded call runs: the
watchdog fires under a lock and only while the call has not ended, and the ending sets that flag
under the same lock and clears an exception fired but not yet delivered
(``PyThreadState_SetAsyncExc(thread, NULL)``); a delivery that lands while the call ends is
caught there. If torch swallows the exception (a bare ``except``), it is raised again `REFIRE`
seconds after each delivery. A result the export returned after the deadline fired is
discarded: the group is past its budget either way, and a swallowed exception may have sent
torch down another path.

What it cannot stop: a call into C++ (a kernel, a C extension) that runs long is interrupted only
when it returns to Python, and code with no loop (or only unsafe frames) is let run until it
has one. The exception needs CPython (``ctypes.pythonapi``).
"""

from __future__ import annotations

import ctypes
import dis
import logging
import os
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, TypeVar

from capture.errors import ReplayError
from replay.pipeline.budget.torchstate import TorchState

__all__ = [
    "BudgetSpent",
    "Deadline",
    "DeadlineReached",
    "REFIRE",
    "call_within",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

POLL = 0.002
"""Seconds between two looks for a safe point once the deadline has passed."""

REFIRE = 1.0
"""Seconds after a delivery before the exception is raised again, where the call goes on."""

_UNSAFE_NAMES = frozenset(
    {
        "__enter__",
        "__exit__",
        "__aenter__",
        "__aexit__",
        "<module>",
        "__del__",
        "remove",
        "_remove",
        "_remove_id",
    }
)
"""Code names where the exception must not land: context managers' set-up and tear-down, module
code, finalizers and the weak dictionaries' callbacks (run by the garbage collector, where an
exception cannot propagate)."""
_STDLIB = tuple(
    {
        os.path.join(p, "")
        for p in (sysconfig.get_paths()["stdlib"], os.__file__.rsplit(os.sep, 1)[0])
    }
)


_TORCH_UNSAFE = tuple(
    os.path.join("torch", *parts)
    for parts in (("utils", "weak.py"), ("_library", "simple_registry.py"))
)
"""torch's code that C++ calls where a Python exception ends the process (``std::terminate``
on ``pybind11::error_already_set``: seen from ``find_torch_dispatch_rule``) or that the
garbage collector runs (the weak dictionaries' callbacks)."""


def _unsafe_file(name: str) -> bool:
    """Code of the standard library (it takes a lock or opens a file, then enters the ``try``
    that releases it: an exception in between leaks it), frozen modules (the import system) and
    `_TORCH_UNSAFE`."""
    if name.startswith("<frozen") or name.endswith(_TORCH_UNSAFE):
        return True
    return name.startswith(_STDLIB) and "-packages" not in name


class BudgetSpent(ReplayError):
    """torch.export ran past the time budget (it was stopped at the deadline)."""


class DeadlineReached(BaseException):  # noqa: N818 - a signal to unwind, as KeyboardInterrupt
    """Raised in the exporting thread at its deadline (module docstring). A BaseException so
    that ``except Exception`` handlers in torch let it through."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        watch = _WATCHES.get(threading.get_ident())
        if watch is not None:
            watch.delivered()


_WATCHES: dict[int, _Watch] = {}
"""The watch of each thread inside `call_within` (one per thread: calls do not nest)."""

_HOOK: dict[str, Any] = {"users": 0, "previous": None}
_HOOK_LOCK = threading.Lock()


def _unraisable(unraisable: Any) -> None:
    """``sys.unraisablehook`` while a watch runs: a `DeadlineReached` that landed where Python
    cannot raise it (a weakref callback the garbage collector ran) is dropped, and raised again
    `REFIRE` seconds later; anything else goes to the hook that was set before."""
    if isinstance(unraisable.exc_value, DeadlineReached):
        return
    previous = _HOOK["previous"] or sys.__unraisablehook__
    previous(unraisable)


def _hook(on: bool) -> None:
    """Sets `_unraisable` while at least one watch runs, and puts the previous hook back."""
    with _HOOK_LOCK:
        if on:
            if _HOOK["users"] == 0:
                _HOOK["previous"] = sys.unraisablehook
                sys.unraisablehook = _unraisable
            _HOOK["users"] += 1
            return
        _HOOK["users"] -= 1
        if _HOOK["users"] == 0:
            if sys.unraisablehook is _unraisable:
                sys.unraisablehook = _HOOK["previous"] or sys.__unraisablehook__
            _HOOK["previous"] = None


@dataclass(frozen=True)
class Deadline:
    """A point in time (``time.monotonic``) an export must end by; None: no bound.

    Example:
        >>> Deadline.after(None).left() is None
        True
        >>> Deadline.after(60.0).left() > 59
        True
    """

    end: float | None

    @classmethod
    def after(cls, seconds: float | None) -> Deadline:
        """The deadline `seconds` from now (None: none)."""
        return cls(None if seconds is None else time.monotonic() + seconds)

    def left(self) -> float | None:
        """Seconds left (at least 0), or None without a bound."""
        return None if self.end is None else max(0.0, self.end - time.monotonic())

    @property
    def passed(self) -> bool:
        """The deadline has passed."""
        left = self.left()
        return left is not None and left <= 0


def _set_async_exc(thread: int, exc: type[BaseException] | None) -> int:
    """``PyThreadState_SetAsyncExc``: `exc` raised in `thread` (None: clear a pending one)."""
    set_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    return int(set_exc(ctypes.c_ulong(thread), None if exc is None else ctypes.py_object(exc)))


_LOOP_JUMPS = frozenset(
    dis.opmap[name]
    for name in (
        "JUMP_BACKWARD",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
        "JUMP_ABSOLUTE",
    )
    if name in dis.opmap
)
"""The opcodes of a loop's back-jump: where the interpreter checks for an exception to raise."""
_COMPARE = dis.opmap["COMPARE_OP"]
_CACHE = dis.opmap.get("CACHE", -1)


def _at_loop_check(frame: FrameType) -> bool:
    """The thread waits at a loop's back-jump in `frame`, its innermost frame: the exception is
    raised there, in that frame, as soon as the thread runs again. Anywhere else the thread
    may be inside C code (a torch operator that released the GIL), and the exception would
    be raised in the next Python function that code calls, which the watchdog cannot see."""
    code, at = frame.f_code.co_code, frame.f_lasti
    if not 0 <= at < len(code):
        return False
    if code[at] in _LOOP_JUMPS:
        return True
    if code[at] != _COMPARE:  # a comparison fused with the loop's jump reports the comparison
        return False
    at += 2
    while at < len(code) and code[at] == _CACHE:
        at += 2
    return at < len(code) and code[at] in _LOOP_JUMPS


def _unsafe(frame: FrameType | None, entry: FrameType) -> bool:
    """A frame between the thread's top and the guarded call's own frame is one where an
    exception must not land (module docstring)."""
    while frame is not None and frame is not entry:
        code = frame.f_code
        if code.co_name in _UNSAFE_NAMES or _unsafe_file(code.co_filename):
            return True
        frame = frame.f_back
    return False


class _Watch:
    """The watchdog of one guarded call."""

    def __init__(self, thread: int, entry: FrameType, end: float) -> None:
        self.thread = thread
        self.entry = entry
        self.fired = 0
        self._lock = threading.Lock()
        self._ended = False
        self._end = threading.Event()
        self._delivered = threading.Event()
        self._watchdog = threading.Thread(
            target=self._run, args=(end,), name="replay-export-deadline", daemon=True
        )

    def start(self) -> None:
        self._watchdog.start()

    def delivered(self) -> None:
        self._delivered.set()

    def _fire(self) -> bool:
        """Raises the exception in the thread if the call still runs and waits at a safe point;
        under the lock that `close` takes."""
        with self._lock:
            if self._ended:
                return False
            top = sys._current_frames().get(self.thread)
            if top is None or not _at_loop_check(top) or _unsafe(top, self.entry):
                return False
            self._delivered.clear()
            _set_async_exc(self.thread, DeadlineReached)
            self.fired += 1
            return True

    def _run(self, end: float) -> None:
        if self._end.wait(max(0.0, end - time.monotonic())):
            return
        while not self._fire():
            if self._end.wait(POLL):
                return
        while True:  # raised again where the call swallows it and goes on
            while not self._delivered.wait(POLL):
                if self._end.is_set():
                    return
            if self._end.wait(REFIRE):
                return
            while not self._fire():
                if self._end.wait(POLL):
                    return

    def close(self) -> None:
        """Ends the watch: nothing is raised in the thread from now on, nothing stays pending."""
        try:
            self._close()
        except DeadlineReached:  # fired while the call ended, delivered here
            self._close()
        self._watchdog.join()

    def _close(self) -> None:
        with self._lock:
            self._ended = True
            if self.fired:
                _set_async_exc(self.thread, None)
        self._end.set()


def call_within(seconds: float | None, call: Callable[[], T], module: Any = None) -> T:
    """``call()`` stopped after `seconds` (None: no bound), in this thread (module docstring).

    Args:
        seconds: The time `call` may take; None runs it without a watchdog.
        call: What to run (a torch.export).
        module: The module `call` exports: its attributes are part of the state put back
            after a stop (`TorchState`).

    Returns:
        What `call` returned.

    Raises:
        BudgetSpent: The deadline came before `call` returned. What `call` raised once
            stopped is dropped, so that no frame of the stopped export stays referenced.
        Exception: What `call` raised before the deadline.

    Example:
        >>> call_within(60.0, lambda: 1 + 1)
        2
    """
    if seconds is None:
        return call()
    if seconds <= 0:
        raise BudgetSpent("the group's time budget was spent before this export")
    before = TorchState.read(module)
    thread = threading.get_ident()
    if thread in _WATCHES:
        raise RuntimeError("call_within does not nest in one thread")
    started = time.monotonic()
    watch = _Watch(thread, sys._getframe(), started + seconds)
    _WATCHES[thread] = watch
    _hook(True)
    try:
        try:
            watch.start()
            result = call()
        finally:
            watch.close()
            _hook(False)
    except (DeadlineReached, Exception):
        if not watch.fired:
            raise
        stopped = True
    else:
        stopped = bool(watch.fired)
    finally:
        _WATCHES.pop(thread, None)
    if stopped:  # raised out here: no frame of the stopped export stays referenced
        raise _spent(seconds, started, watch, before.restore())
    return result


def _spent(seconds: float, started: float, watch: _Watch, restored: list[str]) -> BudgetSpent:
    """The error of a call stopped at its deadline; `restored`: the state put back."""
    if restored:
        logger.warning("state left by the stopped torch.export, put back: %s", ", ".join(restored))
    put_back = f"; put back the state it left: {', '.join(restored)}" if restored else ""
    return BudgetSpent(
        f"torch.export ran past the time budget ({seconds:.1f} s left for it, "
        f"stopped after {time.monotonic() - started:.1f} s{put_back})"
    )
