"""Stores that cannot be opened: one ``Error:`` line and exit 1, in bounded time (issue 14)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server, free_port

ROOT = Path(__file__).resolve().parents[1]


def _capture(
    store: str, env: dict[str, str], *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "--store", store, *(args or ("summary",))],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=300,
    )
    return proc, time.monotonic() - t0


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr  # issue 14
    assert proc.stdout == ""
    return lines[0]


def _aws(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "capture-test-key",
        "AWS_SECRET_ACCESS_KEY": "capture-test-secret",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def test_unknown_uri_scheme() -> None:
    proc, _ = _capture("nosuchscheme://bucket/prefix", {})
    assert "nosuchscheme://bucket/prefix" in _one_error_line(proc)


def test_endpoint_refusing_connections() -> None:
    proc, _ = _capture("s3://bucket/store", _aws(f"http://127.0.0.1:{free_port()}"))
    assert "cannot reach the store s3://bucket/store" in _one_error_line(proc)


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_silent_endpoint_fails_in_bounded_time(silent_endpoint: str) -> None:
    env = {**_aws(silent_endpoint), "CAPTURE_S3_REQUEST_TIMEOUT": "2"}
    proc, seconds = _capture("s3://bucket/store", env)
    assert "cannot reach the store" in _one_error_line(proc)
    # 2 attempts of a 2 s stall timeout, plus start-up: bounded, not pyarrow's ~100 s (issue 14)
    assert seconds < 60


def test_missing_bucket(s3_server: S3Server) -> None:
    proc, _ = _capture("s3://no-such-bucket-here/store", s3_server.env())
    assert "no store at s3://no-such-bucket-here/store" in _one_error_line(proc)


def test_compact_of_an_unreachable_store() -> None:
    proc, _ = _capture("s3://bucket/store", _aws(f"http://127.0.0.1:{free_port()}"), "compact")
    assert "cannot reach the store" in _one_error_line(proc)


def test_access_denied() -> None:
    with S3Server(enforce_auth=True) as server:
        proc, _ = _capture("s3://bucket-of-someone-else/store", server.env())
    assert "access denied to the store" in _one_error_line(proc)


@pytest.mark.parametrize(
    "args", [["payloads"], ["payloads", "--delete-all"]], ids=["list", "delete"]
)
def test_payloads_of_an_unreachable_store(args: list[str]) -> None:
    # issue 24/25: an OSError traceback before; now the same line as every other command.
    proc, _ = _capture("s3://bucket/store", _aws(f"http://127.0.0.1:{free_port()}"), *args)
    assert "cannot reach the store s3://bucket/store" in _one_error_line(proc)
