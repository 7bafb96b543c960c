"""Shared fixture stores, recorded once per test session with the real Recorder.

Both stores are read-only for the tests that use them; a test that writes records its own store
in `tmp_path`.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3_server import S3Server

import capture
from capture.store_api import Store
from fixtures.stores import record_llama, record_seed_scenarios


@pytest.fixture(autouse=True, scope="session")
def _reader_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The readers' cache (capture.store.footer_cache) goes to a temporary folder, not ~/.cache."""
    before = os.environ.get("CAPTURE_CACHE_DIR")
    os.environ["CAPTURE_CACHE_DIR"] = str(tmp_path_factory.mktemp("reader-cache"))
    yield
    if before is None:
        os.environ.pop("CAPTURE_CACHE_DIR", None)
    else:
        os.environ["CAPTURE_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def seeds_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding every seed scenario (model name = scenario name)."""
    root = tmp_path_factory.mktemp("seeds")
    record_seed_scenarios(root)
    return root


@pytest.fixture(scope="session")
def llama_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of tiny-Llama generate() traffic (fixtures.stores.LLAMA_WORKLOAD)."""
    root = tmp_path_factory.mktemp("llama")
    record_llama(root)
    return root


@pytest.fixture(scope="module")
def seeds(seeds_root: Path) -> Iterator[Store]:
    """The seed-scenario store, opened."""
    with capture.open_store(seeds_root) as store:
        yield store


@pytest.fixture(scope="module")
def llama(llama_root: Path) -> Iterator[Store]:
    """The tiny-Llama store, opened."""
    with capture.open_store(llama_root) as store:
        yield store


# -- a real S3 server on loopback (tests/s3_server.py) --------------------------------------------
@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 (a free port), for the whole test session."""
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's AWS environment variables point pyarrow at `s3_server`."""
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections and never answers (a stuck endpoint)."""
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
