"""Stores behind a URI: bounded network waits, and one-line errors for stores that cannot be opened.

pyarrow's S3 client retries a silent or unreachable endpoint for minutes by default (measured:
99 s against a socket that accepts and never answers), and its GCS client sleeps between retries
for as long as fifteen minutes without a network; a command must fail in seconds with one line
instead. Two bounds, for every scheme pyarrow opens (``s3://``, ``gs://``, ``hdfs://``,
``abfs://``, ...):

- the client's own limits where it has them (S3: connect and stall timeouts, two attempts;
  GCS: a retry time limit), so that its error says what went wrong;
- `within`: opening a store (the filesystem set up, its root looked at) runs in a worker thread
  and the command waits for it at most `STORE_TIMEOUT_S` seconds (``CAPTURE_STORE_TIMEOUT``).
  A native sleep or a blocking connect cannot be interrupted from Python; the thread is left
  to its fate (a daemon: the process exits without it) and the command fails with one line.

Imports pyarrow only.
"""

from __future__ import annotations

import atexit
import datetime as dt
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import pyarrow.fs as pafs

from capture.errors import CaptureError, StoreNotFound

__all__ = [
    "CONNECT_TIMEOUT_S",
    "REQUEST_TIMEOUT_S",
    "STORE_TIMEOUT_S",
    "bounded",
    "invalid_uri",
    "leave_if_stuck",
    "store_error",
    "within",
]

_T = TypeVar("_T")


def _seconds(name: str, default: str) -> float:
    """A positive number of seconds from the environment variable `name`."""
    text = os.environ.get(name, default)
    try:
        value = float(text)
    except ValueError:
        raise CaptureError(
            f"{name}={text!r} is not a number of seconds; set it to e.g. 20"
        ) from None
    if not value > 0:
        raise CaptureError(f"{name}={text!r} must be more than 0 seconds")
    return value


STORE_TIMEOUT_S = _seconds("CAPTURE_STORE_TIMEOUT", "20")
"""Seconds a command waits for a remote store to open (``CAPTURE_STORE_TIMEOUT``), any scheme."""

CONNECT_TIMEOUT_S = _seconds("CAPTURE_S3_CONNECT_TIMEOUT", "5")
"""Seconds to wait for an S3 endpoint to accept a connection (``CAPTURE_S3_CONNECT_TIMEOUT``)."""

REQUEST_TIMEOUT_S = _seconds("CAPTURE_S3_REQUEST_TIMEOUT", "10")
"""Seconds an S3 request may stall without a byte moving (``CAPTURE_S3_REQUEST_TIMEOUT``)."""

_ATTEMPTS = 2


def bounded(fs: pafs.FileSystem) -> pafs.FileSystem:
    """`fs` with bounded connect/stall timeouts and retries (S3), a bounded retry time (GCS).

    Timeouts given in the URI or by the caller are kept; only pyarrow's defaults (unbounded
    in effect) are replaced. The GCS limit is half of `STORE_TIMEOUT_S` (its last retry may
    overrun it), so that the client's own error (credentials, network) comes before `within`
    gives up.
    """
    gcs = getattr(pafs, "GcsFileSystem", None)
    if gcs is not None and isinstance(fs, gcs):
        options = dict(fs.__reduce__()[1][0])
        if options.get("retry_time_limit") is None:
            options["retry_time_limit"] = dt.timedelta(seconds=STORE_TIMEOUT_S / 2)
            return gcs(**options)
        return fs
    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    options = dict(fs.__reduce__()[1][0])  # the options pyarrow parsed from the URI
    if options.get("connect_timeout", -1) < 0:
        options["connect_timeout"] = CONNECT_TIMEOUT_S
    if options.get("request_timeout", -1) < 0:
        options["request_timeout"] = REQUEST_TIMEOUT_S
    options["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=_ATTEMPTS)
    return pafs.S3FileSystem(**options)


def within(store: str, work: Callable[[], _T], seconds: float | None = None) -> _T:
    """`work()` (opening the store at `store`), waited for at most `seconds`.

    Args:
        store: The store's URI, for the message.
        work: What opens it; its exceptions are raised here.
        seconds: The limit; `STORE_TIMEOUT_S` when None.

    Raises:
        StoreNotFound: No answer within the limit (one line, naming the setting).

    Example:
        >>> within("s3://bucket/store", lambda: 42)
        42
    """
    limit = STORE_TIMEOUT_S if seconds is None else seconds
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as e:  # handed to the waiting thread
            outcome.append((False, e))

    worker = threading.Thread(target=run, name="capture-open-store", daemon=True)
    worker.start()
    worker.join(limit)
    if not outcome:
        _stuck.append((worker, limit))
        if len(_stuck) == 1:
            atexit.register(_let_stuck_finish)
        raise StoreNotFound(
            f"cannot reach the store {store}: no answer within {limit:g} s; check the network, "
            "the endpoint and the credentials (set CAPTURE_STORE_TIMEOUT to wait longer)"
        )
    ok, value = outcome[0]
    if not ok:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]


_stuck: list[tuple[threading.Thread, float]] = []
"""Workers `within` stopped waiting for (still inside the filesystem's client)."""


def _let_stuck_finish() -> None:
    """At exit, gives each stuck worker up to its limit again to end: a client torn down while
    one of its threads still sleeps in a retry crashes the process (seen with GCS)."""
    for worker, limit in _stuck:
        worker.join(limit)


def leave_if_stuck(code: int) -> None:
    """Ends the process with `code` now (output flushed) when a worker `within` gave up on is
    still stuck: pyarrow's teardown at exit (S3's) waits for its request, minutes at worst.
    For a command line that failed on an unreachable store; a library caller never needs it."""
    if any(worker.is_alive() for worker, _ in _stuck):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed: nothing left to write
                pass
        os._exit(code)


def invalid_uri(store: str, error: Exception) -> CaptureError:
    """One line for a URI pyarrow cannot parse (``pyarrow.ArrowInvalid``: an unknown scheme,
    an unexpected option), and what to do."""
    text = " ".join(str(error).split())
    return StoreNotFound(
        f"cannot open store {store}: {text}; use a directory or a URI pyarrow knows "
        "(s3://bucket/prefix, gs://, hdfs://, file://)"
    )


def store_error(store: str, error: Exception) -> CaptureError:
    """One line saying why the store at `store` cannot be opened, and what to do.

    pyarrow reports a remote filesystem's failures (S3's network, credentials, buckets) as a
    plain ``OSError`` whose only content is its text (no error code, no subclass), so the advice
    is chosen from that text; whatever it says, the error is the same `StoreNotFound`, and an
    unknown text gets the general line. A URI pyarrow cannot parse is told by its type instead
    (`invalid_uri`).
    """
    text = " ".join(str(error).split())
    if len(text) > 300:  # HDFS lists every folder it looked for a JVM in
        text = text[:297] + "..."
    if "NETWORK_CONNECTION" in text or "Timeout was reached" in text:
        return StoreNotFound(
            f"cannot reach the store {store}: {text}; check AWS_ENDPOINT_URL / the network "
            f"(waited at most {CONNECT_TIMEOUT_S:g} s to connect, {REQUEST_TIMEOUT_S:g} s per "
            "stalled request)"
        )
    if "ACCESS_DENIED" in text or "AccessDenied" in text or "HTTP status 403" in text:
        return StoreNotFound(
            f"access denied to the store {store}: {text}; check the credentials "
            "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
        )
    if "Retry policy exhausted" in text or "UNAVAILABLE" in text:  # GCS
        return StoreNotFound(
            f"cannot reach the store {store}: {text[:300]}; check the network and the "
            "credentials (GOOGLE_APPLICATION_CREDENTIALS; waited at most "
            f"{STORE_TIMEOUT_S / 2:g} s, CAPTURE_STORE_TIMEOUT)"
        )
    if "NoSuchBucket" in text or "NO_SUCH_BUCKET" in text:
        return StoreNotFound(f"no bucket for the store {store}: {text}")
    return StoreNotFound(f"cannot open store {store}: {text}")
