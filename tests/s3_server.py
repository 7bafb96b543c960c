"""A real S3-compatible HTTP server on loopback for the tests: moto's standalone server.

moto (``pip install 'moto[server]'``, in the ``test`` extra) serves the S3 REST API over HTTP;
pyarrow's S3FileSystem talks to it exactly as to AWS, pointed there by the standard AWS
environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_REGION``). The server listens on 127.0.0.1 on a free port and is stopped by the context
manager (and dies with the test process: it is a child started with a parent-death check).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any
from urllib.parse import urlparse

__all__ = ["S3Server", "free_port"]

ACCESS_KEY = "capture-test-key"
SECRET_KEY = "capture-test-secret"
REGION = "us-east-1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The server process exits when its parent does (the test run), even after a SIGKILL of it.
_SERVE = r"""
import os, sys, threading, time
from moto.server import ThreadedMotoServer
parent = os.getppid()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]))
server.start()
while os.getppid() == parent:
    time.sleep(0.5)
server.stop()
"""


class S3Server:
    """moto's S3 server on 127.0.0.1:<free port>, for as long as the context lasts."""

    def __init__(self, enforce_auth: bool = False) -> None:
        """`enforce_auth`: moto checks credentials (IAM): unknown keys get 403 Access Denied."""
        self.enforce_auth = enforce_auth
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.requests_log = os.path.join(tempfile.mkdtemp(prefix="capture-moto-"), "requests")

    def env(self) -> dict[str, str]:
        """The AWS environment variables that point pyarrow (and boto3) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> S3Server:
        """Starts the server and waits (up to 60 s) until it answers."""
        env = {
            **os.environ,
            "MOTO_ALLOW_NONEXISTENT_REGION": "true",
            "MOTO_RECORDER_FILEPATH": self.requests_log,
        }
        if self.enforce_auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVE, str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"moto server did not answer on {self.endpoint} within 60 s")

    def stop(self) -> None:
        """Stops the server process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def create_bucket(self, name: str) -> str:
        """Creates bucket `name` through the S3 API (pyarrow's S3FileSystem); returns it."""
        import pyarrow.fs as pafs

        fs = self.filesystem()
        fs.create_dir(name)
        assert fs.get_file_info(name).type == pafs.FileType.Directory
        return name

    def filesystem(self) -> object:
        """A pyarrow S3FileSystem on this server."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=self.endpoint,
            scheme="http",
            allow_bucket_creation=True,
            allow_bucket_deletion=True,
        )

    def _moto_api(self, action: str) -> None:
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/recorder/{action}", data=b"", method="POST"
        )
        with urllib.request.urlopen(request, timeout=10):
            pass

    @contextlib.contextmanager
    def recording(self) -> Iterator[Callable[[], list[dict[str, Any]]]]:
        """Records the HTTP requests the server receives (moto's recorder) while it lasts.

        Yields a function returning them so far: dicts with ``method``, ``path`` (the key, as
        ``/bucket/key``) and ``copy`` (the ``x-amz-copy-source`` header, None for plain PUTs).
        """
        self._moto_api("reset-recording")
        self._moto_api("start-recording")

        def requests() -> list[dict[str, Any]]:
            out = []
            with open(self.requests_log, encoding="utf-8") as f:
                for line in f:
                    entry = json.loads(line)
                    headers = {k.lower(): v for k, v in entry["headers"].items()}
                    out.append(
                        {
                            "method": entry["method"],
                            "path": urlparse(entry["url"]).path,
                            "copy": headers.get("x-amz-copy-source"),
                        }
                    )
            return out

        try:
            yield requests
        finally:
            self._moto_api("stop-recording")

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
