"""A real server: gunicorn with uvicorn workers, recording in each worker.

The server is `examples/server/serve_gunicorn.py`, the code the docs show, run by
`fixtures.server_load`: a tiny Llama under ``generate()`` on 127.0.0.1; client threads send a
bounded load while the master is sent SIGHUP (a graceful reload), workers are recycled
(``max_requests``) and the master is sent SIGTERM with requests in flight. Every request the
server answered reports its pid and how many forward calls it made: the store must hold exactly
those calls, each once, per worker process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import capture
from fixtures.server_load import booted_after_reload, run_server_load

ROOT = Path(__file__).resolve().parents[1]
MAX_REQUESTS = 12
RELOAD_AT = 24  # 2 workers x 12: one is recycled first; the 16 answers after leave both new
# workers under 12, so neither is being replaced when SIGTERM comes with requests in flight


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
        # the handler stays installed until the last write, which the signal would cut
        assert store.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 5}]


@pytest.mark.slow
def test_every_served_request_is_stored_once_across_reload_recycling_and_shutdown(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    load = run_server_load(
        store, tmp_path / "server", max_requests=MAX_REQUESTS, reload_at=RELOAD_AT
    )
    assert load.returncode == 0, load.stderr[-3000:]
    assert "Traceback" not in load.stderr, load.stderr[-3000:]
    assert "Handling signal: hup" in load.stderr  # the reload happened
    assert len(load.answers) >= 40
    # Recycled: uvicorn ends a worker once it has served max_requests (checked once a second,
    # so it may serve a few more; the load reloads only after that); reloaded: a worker booted
    # after the SIGHUP answered. Read from the server's own log, not from how many pids
    # answered (timing decides that).
    assert f"Maximum request limit of {MAX_REQUESTS} exceeded" in load.stderr
    assert booted_after_reload(load.stderr) & {a["pid"] for a in load.answers}
    assert any(a["done"] > load.term_at for a in load.answers)  # answered during the shutdown
    served: Counter[int] = Counter()
    for answer in load.answers:
        served[answer["pid"]] += answer["calls"]
    with capture.open_store(store) as opened:
        rows = opened.query(
            "SELECT pid, count(*) AS n, count(DISTINCT call_id) AS d FROM calls GROUP BY pid"
        ).to_pylist()
        counted = sum(m.calls for m in opened.summary().models)
    stored = {int(r["pid"]): int(r["n"]) for r in rows}
    assert all(r["n"] == r["d"] for r in rows)  # each call once
    # every served request's calls stored, nothing else, per worker process
    assert stored == dict(served)
    assert counted == sum(stored.values())
