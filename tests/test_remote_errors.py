"""Remote stores of every scheme pyarrow opens answer in bounded time: unreachable, a command
prints one ``Error:`` line and exits 1 within ``CAPTURE_STORE_TIMEOUT`` seconds (plus start-up).
No test needs a network: the endpoints are local sockets that refuse or never answer, and the
default endpoints are unreachable or refuse the missing credentials."""

from __future__ import annotations

import time

import pytest
from cli_runs import Run, error_line, run_cli
from s3_server import free_port

from capture.errors import StoreNotFound
from capture.store.remote import within

LIMIT_S = 3


def _capture(store: str, *args: str, **env: str) -> Run:
    limits = {"CAPTURE_STORE_TIMEOUT": str(LIMIT_S), "AWS_EC2_METADATA_DISABLED": "true"}
    return run_cli(store, *args, env={**limits, **env}, timeout=120)


# What a run may take: the limit, the exit's wait for the stuck client (the limit again), and
# interpreter start-up on a loaded machine.
BOUND_S = 2 * LIMIT_S + 30


def test_gcs_endpoint_that_never_answers(silent_port: int) -> None:
    store = f"gs://bucket/store?endpoint_override=127.0.0.1:{silent_port}&scheme=http"
    proc, seconds = _capture(store)
    assert "cannot reach the store gs://bucket/store" in error_line(proc)
    assert seconds < BOUND_S


def test_gcs_default_endpoint_without_credentials() -> None:
    proc, seconds = _capture("gs://capture-no-such-bucket/store")
    assert "gs://capture-no-such-bucket/store" in error_line(proc)
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
    assert "cannot reach the store s3://bucket/store" in error_line(proc)
    assert seconds < BOUND_S + 2 * LIMIT_S


def test_hdfs_namenode_refusing() -> None:
    proc, seconds = _capture(f"hdfs://127.0.0.1:{free_port()}/store")
    assert "hdfs://127.0.0.1" in error_line(proc)
    assert seconds < BOUND_S


def test_azure_without_a_reachable_login() -> None:
    proc, seconds = _capture(
        "abfs://container@capturetest.dfs.core.windows.net/store",
        AZURE_CLIENT_ID="capture-test",
        AZURE_TENANT_ID="capture-test",
        AZURE_CLIENT_SECRET="capture-test",
        AZURE_AUTHORITY_HOST=f"http://127.0.0.1:{free_port()}",
    )
    assert "abfs://container@capturetest.dfs.core.windows.net/store" in error_line(proc)
    assert seconds < BOUND_S


@pytest.mark.parametrize("command", [["query", "SELECT 1"], ["compact"], ["payloads"]])
def test_every_command_is_bounded(silent_port: int, command: list[str]) -> None:
    store = f"gs://bucket/store?endpoint_override=127.0.0.1:{silent_port}&scheme=http"
    proc, seconds = _capture(store, *command)
    assert "cannot reach the store gs://bucket/store" in error_line(proc)
    assert seconds < BOUND_S


def test_a_client_stuck_in_native_code_is_given_up_on() -> None:
    t0 = time.monotonic()
    with pytest.raises(StoreNotFound, match=r"no answer within 0\.5 s.*CAPTURE_STORE_TIMEOUT"):
        within("gs://bucket/store", lambda: time.sleep(3), 0.5)  # sleeps outside the GIL
    assert time.monotonic() - t0 < 2.5
    # the worker ends on its own: a command run in this process later exits normally (a stuck
    # one would make it exit at once, capture.store.remote.leave_if_stuck)
    time.sleep(3)


def test_the_limit_is_settable_and_checked() -> None:
    proc, _ = _capture("gs://bucket/store", CAPTURE_STORE_TIMEOUT="soon")
    assert "CAPTURE_STORE_TIMEOUT='soon' is not a number of seconds" in error_line(proc)
