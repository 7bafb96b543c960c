"""Stores that cannot be opened: one ``Error:`` line and exit 1, in bounded time."""

from __future__ import annotations

import pytest
from cli_runs import Run, error_line, run_cli
from s3_server import S3Server, free_port


def _capture(store: str, env: dict[str, str], *args: str) -> Run:
    return run_cli(store, *args, env=env, timeout=300)


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
    assert "nosuchscheme://bucket/prefix" in error_line(proc, alone=True)


def test_endpoint_refusing_connections() -> None:
    proc, _ = _capture("s3://bucket/store", _aws(f"http://127.0.0.1:{free_port()}"))
    assert "cannot reach the store s3://bucket/store" in error_line(proc, alone=True)


def test_silent_endpoint_fails_in_bounded_time(silent_port: int) -> None:
    env = {**_aws(f"http://127.0.0.1:{silent_port}"), "CAPTURE_S3_REQUEST_TIMEOUT": "2"}
    proc, seconds = _capture("s3://bucket/store", env)
    assert "cannot reach the store" in error_line(proc, alone=True)
    # 2 attempts of a 2 s stall timeout, plus start-up: bounded, not pyarrow's ~100 s
    assert seconds < 60


def test_missing_bucket(s3_server: S3Server) -> None:
    proc, _ = _capture("s3://no-such-bucket-here/store", s3_server.env())
    assert "no store at s3://no-such-bucket-here/store" in error_line(proc, alone=True)


def test_compact_of_an_unreachable_store() -> None:
    proc, _ = _capture("s3://bucket/store", _aws(f"http://127.0.0.1:{free_port()}"), "compact")
    assert "cannot reach the store" in error_line(proc, alone=True)


def test_access_denied() -> None:
    with S3Server(enforce_auth=True) as server:
        proc, _ = _capture("s3://bucket-of-someone-else/store", server.env())
    assert "access denied to the store" in error_line(proc, alone=True)


@pytest.mark.parametrize(
    "args", [["payloads"], ["payloads", "--delete-all"]], ids=["list", "delete"]
)
def test_payloads_of_an_unreachable_store(args: list[str]) -> None:
    # the same one line as every other command, no OSError traceback.
    proc, _ = _capture("s3://bucket/store", _aws(f"http://127.0.0.1:{free_port()}"), *args)
    assert "cannot reach the store s3://bucket/store" in error_line(proc, alone=True)
