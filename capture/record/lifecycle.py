"""Process events a running recorder must survive: SIGTERM/SIGHUP, fork(), torch.compile.

- **SIGTERM / SIGHUP** (how Kubernetes, systemd and most supervisors stop a server): while a
  recorder runs, a handler flushes every running recorder (at most `SIGNAL_FLUSH_SECONDS`),
  then hands the signal on. When the process had no handler of its own (the default action), the
  default is restored and the signal re-delivered, so the process still dies of it and its exit
  status is the signal's. A Python handler installed before the recorder started is chained:
  it runs after the flush, unchanged. A signal that was ignored stays ignored. A server that
  installs its own handler after `start()` replaces ours: it should call `Recorder.flush()` (or
  `stop()`) in it. Handlers can only be installed from the main thread; a recorder started
  elsewhere relies on `atexit` and the server's own shutdown. A signal that arrives while a
  recorder is stopping (`stopping`) waits for the stop to write what it buffered: delivered
  after it when it interrupted the stop itself, else after the stop ends (at most
  `SIGNAL_FLUSH_SECONDS`): a gunicorn worker recycled by ``max_requests`` gets the master's
  SIGTERM while its recorder writes its last calls, and must not die without them.
- **fork()**: in the child, every running recorder gets a new file prefix, new call ids, an
  empty queue (the calls buffered before the fork are the parent's to write) and its own writer
  thread, and records the child's calls.
- **torch.compile**: `outside_compiled_region` marks the recorder's wrapper so that Dynamo does
  not trace it: a compiled caller graph-breaks at the wrapper, which runs eagerly, records,
  and calls the original method, whose frame is compiled as usual.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, Protocol

from capture import compat

__all__ = ["SIGNAL_FLUSH_SECONDS", "track", "untrack", "stopping", "outside_compiled_region"]

SIGNAL_FLUSH_SECONDS = 10.0
"""Longest time the SIGTERM/SIGHUP handler waits for the writers to flush."""

_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class _Tracked(Protocol):
    def flush(self, timeout: float | None = ...) -> None: ...

    def after_fork_in_child(self) -> None: ...


_active: list[_Tracked] = []
_previous: dict[int, Any] = {}  # signal -> the handler we chained to
_lock = threading.Lock()
_stopping: dict[int, tuple[threading.Event, bool]] = {}  # id(recorder) -> (done, on main)
_deferred: list[int] = []  # signals that interrupted a stop on the main thread


def track(recorder: _Tracked) -> None:
    """Registers a started recorder: flushed on SIGTERM/SIGHUP, renewed in a forked child."""
    with _lock:
        if recorder not in _active:
            _active.append(recorder)
    _install()


def untrack(recorder: _Tracked) -> None:
    """Forgets a stopped recorder; the last one restores the signal handlers it replaced."""
    with _lock:
        if recorder in _active:
            _active.remove(recorder)
        last = not _active
    if last:
        _uninstall()


@contextlib.contextmanager
def stopping(recorder: _Tracked) -> Iterator[None]:
    """While `recorder` stops (writes what it buffered), SIGTERM and SIGHUP wait for it.

    The recorder stays tracked (our handlers installed) until the stop is done, then is
    untracked. A signal that interrupted the stop on the main thread is delivered again then,
    to whatever handles it by that time (the process's own, or the default: it dies of it).

    Args:
        recorder: A started recorder, about to write its last calls.

    Example:
        >>> with stopping(recorder):  # doctest: +SKIP
        ...     recorder._writer.close()
    """
    done = threading.Event()
    on_main = threading.current_thread() is threading.main_thread()
    with _lock:
        _stopping[id(recorder)] = (done, on_main)
    try:
        yield
    finally:
        with _lock:
            del _stopping[id(recorder)]
        done.set()
        untrack(recorder)
        if on_main and _deferred and not any(main for _, main in _stopping.values()):
            pending = list(dict.fromkeys(_deferred))
            _deferred.clear()
            for sig in pending:
                signal.raise_signal(sig)


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in _SIGNALS:
        if sig in _previous:
            continue
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN or previous is None:  # ignored, or a C-level handler
            continue
        signal.signal(sig, _on_signal)
        _previous[sig] = previous


def _uninstall() -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # ours stays: with no recorder left it only hands the signal on
    for sig, previous in list(_previous.items()):
        if signal.getsignal(sig) is _on_signal:
            signal.signal(sig, previous)
        del _previous[sig]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # No lock here: the main thread may hold it where the signal interrupted it.
    if any(main for _, main in list(_stopping.values())):
        _deferred.append(signum)  # the interrupted stop writes first, then delivers it
        return
    for recorder in list(_active):
        stop = _stopping.get(id(recorder))
        if stop is not None:  # another thread is writing its last calls: wait for them
            stop[0].wait(SIGNAL_FLUSH_SECONDS)
            continue
        try:
            recorder.flush(timeout=SIGNAL_FLUSH_SECONDS)
        except Exception:  # a failed flush is counted by the writer; the signal goes on
            pass
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
        return
    # The default action: die of the signal, as the process would have without us.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    _stopping.clear()  # the child's recorders are not stopping
    _deferred.clear()
    for recorder in list(_active):
        try:
            recorder.after_fork_in_child()
        except Exception:  # never break the child: it records nothing then
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def outside_compiled_region(
    wrapper: Callable[..., Any], *helpers: Callable[..., Any]
) -> Callable[..., Any]:
    """A function that runs `wrapper` eagerly under torch.compile, compiling what it calls.

    Dynamo does not inline the returned function (a graph break in the compiled caller; the
    mark ``torch.compiler.disable`` sets, without importing Dynamo, seconds at start-up), and
    skips the frames of it and of `wrapper` while the frames `wrapper` calls (the original
    method) are compiled as usual. `helpers` (the recording code) are skipped with everything
    they call, so Dynamo never looks at the recording itself. With ``fullgraph=True`` the graph
    break is an error: `Recorder(compiled=False)` lets such a compile trace through instead.
    """

    def outside(*args: Any, **kwargs: Any) -> Any:
        return wrapper(*args, **kwargs)

    # Dynamo's marks and frame strategies are private torch APIs: the one seam for them.
    compat.run_outside_dynamo(
        outside, (wrapper,), helpers, "capture.Recorder records outside the compiled region"
    )
    return outside
