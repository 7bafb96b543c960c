"""Remote stores of every scheme pyarrow opens answer in bounded time: unreachable, a command
prints one ``Error:`` line and exits 1 within ``CAPTURE_STORE_TIMEOUT`` seconds (plus start-up).
No test needs a network: the endpoints are local sockets that refuse or never answer, and the
default endpoints are unreachable or refuse the missing credentials."""

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
from s3_server import free_port

from capture.errors import StoreNotFound
from capture.store.remote import within

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 3


def _capture(store: str, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "--store", store, *(args or ("summary",))],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "CAPTURE_STORE_TIMEOUT": str(LIMIT_S),
            "AWS_EC2_METADATA_DISABLED": "true",
            **env,
        },
        cwd=ROOT,
        timeout=120,
    )
    return proc, time.monotonic() - t0


def _error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections and never answers."""
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
    yield int(server.getsockname()[1])
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


# What a run may take: the limit, the exit's wait for the stuck client (the limit again), and
# interpreter start-up on a loaded machine.
BOUND_S = 2 * LIMIT_S + 30


def test_gcs_endpoint_that_never_answers(silent_port: int) -> None:
    store = f"gs://bucket/store?endpoint_override=127.0.0.1:{silent_port}&scheme=http"
    proc, seconds = _capture(store)
    assert "cannot reach the store gs://bucket/store" in _error_line(proc)
    assert seconds < BOUND_S


def test_gcs_default_endpoint_without_credentials() -> None:
    proc, seconds = _capture("gs://capture-no-such-bucket/store")
    assert "gs://capture-no-such-bucket/store" in _error_line(proc)
    assert seconds < BOUND_S


def test_s3_endpoint_that_never_answers(silent_port: int) -> None:
    proc, seconds = _capture(
        "s3://bucket/store",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{silent_port}",
        AWS_ACCESS_KEY_ID="k",
        AWS_SECRET_ACCESS_KEY="s",
        AWS_REGION="us-east-1",
        CAPTURE_S3_REQUEST_TIMEOUT="60",  # the client alone would wait 2 x 60 s
    )
    assert "cannot reach the store s3://bucket/store" in _error_line(proc)
    assert seconds < BOUND_S + 2 * LIMIT_S


def test_hdfs_namenode_refusing() -> None:
    proc, seconds = _capture(f"hdfs://127.0.0.1:{free_port()}/store")
    assert "hdfs://127.0.0.1" in _error_line(proc)
    assert seconds < BOUND_S


def test_azure_without_a_reachable_login() -> None:
    proc, seconds = _capture(
        "abfs://container@capturetest.dfs.core.windows.net/store",
        AZURE_CLIENT_ID="capture-test",
        AZURE_TENANT_ID="capture-test",
        AZURE_CLIENT_SECRET="capture-test",
        AZURE_AUTHORITY_HOST=f"http://127.0.0.1:{free_port()}",
    )
    assert "abfs://container@capturetest.dfs.core.windows.net/store" in _error_line(proc)
    assert seconds < BOUND_S


@pytest.mark.parametrize("command", [["query", "SELECT 1"], ["compact"], ["payloads"]])
def test_every_command_is_bounded(silent_port: int, command: list[str]) -> None:
    store = f"gs://bucket/store?endpoint_override=127.0.0.1:{silent_port}&scheme=http"
    proc, seconds = _capture(store, *command)
    assert "cannot reach the store gs://bucket/store" in _error_line(proc)
    assert seconds < BOUND_S


def test_a_client_stuck_in_native_code_is_given_up_on() -> None:
    t0 = time.monotonic()
    with pytest.raises(StoreNotFound, match=r"no answer within 0\.5 s.*CAPTURE_STORE_TIMEOUT"):
        within("gs://bucket/store", lambda: time.sleep(30), 0.5)  # sleeps outside the GIL
    assert time.monotonic() - t0 < 5


def test_the_limit_is_settable_and_checked() -> None:
    proc, _ = _capture("gs://bucket/store", CAPTURE_STORE_TIMEOUT="soon")
    assert "CAPTURE_STORE_TIMEOUT='soon' is not a number of seconds" in _error_line(proc)
