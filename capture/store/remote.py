"""Stores behind a URI: bounded network waits, and one-line errors for stores that cannot be opened.

pyarrow's S3 client retries a silent or unreachable endpoint for minutes by default (measured:
99 s against a socket that accepts and never answers); a command must fail in seconds with one
line instead. Imports pyarrow only.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from capture.errors import CaptureError, StoreNotFound

__all__ = ["CONNECT_TIMEOUT_S", "REQUEST_TIMEOUT_S", "bounded", "invalid_uri", "store_error"]

CONNECT_TIMEOUT_S = float(os.environ.get("CAPTURE_S3_CONNECT_TIMEOUT", "5"))
"""Seconds to wait for an S3 endpoint to accept a connection (``CAPTURE_S3_CONNECT_TIMEOUT``)."""

REQUEST_TIMEOUT_S = float(os.environ.get("CAPTURE_S3_REQUEST_TIMEOUT", "10"))
"""Seconds an S3 request may stall without a byte moving (``CAPTURE_S3_REQUEST_TIMEOUT``)."""

_ATTEMPTS = 2


def bounded(fs: pafs.FileSystem) -> pafs.FileSystem:
    """`fs` with bounded connect/stall timeouts and retries when it is an S3 filesystem.

    Timeouts given in the URI or by the caller are kept; only pyarrow's defaults (unbounded
    in effect) are replaced.
    """
    if not isinstance(fs, pafs.S3FileSystem):
        return fs
    options = dict(fs.__reduce__()[1][0])  # the options pyarrow parsed from the URI
    if options.get("connect_timeout", -1) < 0:
        options["connect_timeout"] = CONNECT_TIMEOUT_S
    if options.get("request_timeout", -1) < 0:
        options["request_timeout"] = REQUEST_TIMEOUT_S
    options["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=_ATTEMPTS)
    return pafs.S3FileSystem(**options)


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
    if "NoSuchBucket" in text or "NO_SUCH_BUCKET" in text:
        return StoreNotFound(f"no bucket for the store {store}: {text}")
    return StoreNotFound(f"cannot open store {store}: {text}")
