"""A real server (issue 25 build item 6): gunicorn with uvicorn workers, recording in each worker.

The server is `examples/server/serve_gunicorn.py`, the code the docs show. It runs a tiny Llama
under ``generate()`` on 127.0.0.1; client threads send a bounded load while the master is sent
SIGHUP (a graceful reload), workers are recycled (``max_requests``) and the master is sent SIGTERM
with requests in flight. Every request the server answered reports its pid and how many forward
calls it made: the store must hold exactly those calls, each once, per worker process.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from s3_server import free_port

import capture

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "server" / "serve_gunicorn.py"
MAX_REQUESTS = 8
RELOAD_AT = 16  # answered requests before SIGHUP
STOP_AT = 40  # answered requests before SIGTERM


# A process whose recorder is stopping when SIGTERM arrives (as gunicorn's master signals a
# worker that max_requests is already recycling): the signal interrupts the stop's last write.
_TERM_DURING_STOP = r"""
import signal, sys, torch
import capture
from capture.record import writer
real = writer.StoreWriter.close
def close(self, timeout=30.0):
    signal.raise_signal(signal.SIGTERM)  # delivered here, in the middle of stop()
    real(self, timeout)
writer.StoreWriter.close = close
model = torch.nn.Linear(2, 2)
rec = capture.Recorder(model, sys.argv[1], flush_seconds=3600)
rec.start()
for _ in range(5):
    model(torch.ones(1, 2))
rec.stop()
print("not reached: the process dies of the SIGTERM once the calls are written")
"""


def test_a_sigterm_during_stop_waits_for_the_last_write(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _TERM_DURING_STOP, str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert proc.returncode == -signal.SIGTERM, proc.stderr  # it still dies of the signal
    assert proc.stdout == ""
    with capture.open_store(tmp_path) as store:
        # issue 25: the handler was uninstalled before the last write, which the signal cut
        assert store.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 5}]


def _post(port: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """The server's answer, or None when the request was not served (refused, reset)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", "/generate", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        data = response.read()
        if response.status != 200:
            return None
        answer: dict[str, Any] = json.loads(data)
        return answer
    except (OSError, http.client.HTTPException):  # the server is going away
        return None
    finally:
        conn.close()


def _wait_ready(port: int, server: subprocess.Popen[bytes], seconds: float = 240) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            time.sleep(0.5)
        finally:
            conn.close()
    raise RuntimeError("gunicorn did not answer /health")


@pytest.mark.slow
def test_every_served_request_is_stored_once_across_reload_recycling_and_shutdown(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    port = free_port()
    log = tmp_path / "gunicorn.stderr"
    with log.open("wb") as err:
        server = subprocess.Popen(
            [
                sys.executable, "-m", "gunicorn", "-c", str(EXAMPLE), "serve_gunicorn:app",
                "--bind", f"127.0.0.1:{port}", "--workers", "2",
                "--max-requests", str(MAX_REQUESTS),
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env={**os.environ, "CAPTURE_STORE": str(store), "PYTHONPATH": str(ROOT)},
            cwd=tmp_path,
        )  # fmt: skip
    served: list[dict[str, Any]] = []
    lock = threading.Lock()
    stopping = threading.Event()
    term_at: list[float] = []

    def client(seed: int) -> None:
        n = 0
        while not stopping.is_set():
            n += 1
            body = {
                "request_id": uuid.uuid4().hex,
                "prompt_len": 3 + (seed + n) % 6,
                "max_new_tokens": 1 + (seed * 7 + n) % 4,
            }
            answer = _post(port, body)
            if answer is None:
                time.sleep(0.05)
                continue
            assert answer["request_id"] == body["request_id"]
            with lock:
                served.append({**answer, "done": time.monotonic()})

    try:
        _wait_ready(port, server)
        threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 240
        while len(served) < RELOAD_AT and time.monotonic() < deadline:
            time.sleep(0.05)
        server.send_signal(signal.SIGHUP)  # graceful reload: new workers, old ones finish
        while len(served) < STOP_AT and time.monotonic() < deadline:
            time.sleep(0.05)
        term_at.append(time.monotonic())
        server.send_signal(signal.SIGTERM)  # requests are in flight on three connections
        server.wait(120)
    finally:
        stopping.set()
        for t in threads:
            t.join(120)
        if server.poll() is None:
            server.kill()
            server.wait()
    stderr = log.read_text(errors="replace")
    assert server.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "Handling signal: hup" in stderr  # the reload happened
    assert len(served) >= STOP_AT
    by_pid = Counter(a["pid"] for a in served)
    assert max(by_pid.values()) >= MAX_REQUESTS and len(by_pid) >= 4  # recycled and reloaded
    assert any(a["done"] > term_at[0] for a in served)  # answered during the shutdown
    calls = Counter()
    for answer in served:
        calls[answer["pid"]] += answer["calls"]
    with capture.open_store(store) as opened:
        rows = opened.query(
            "SELECT pid, count(*) AS n, count(DISTINCT call_id) AS d FROM calls GROUP BY pid"
        ).to_pylist()
        counted = sum(m["calls"] for m in opened.summary()["models"])
    stored = {int(r["pid"]): int(r["n"]) for r in rows}
    assert all(r["n"] == r["d"] for r in rows)  # each call once
    # issue 25: every served request's calls stored, nothing else, per worker process
    assert stored == dict(calls)
    assert counted == sum(stored.values())
