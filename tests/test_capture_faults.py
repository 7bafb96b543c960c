"""Fault suite: signals, fork, compiled models, disk full, store removal, poison records.

Every scenario runs in its own subprocess with a time limit. Each ends by checking that the
store agrees with itself and with the recorder's counters: the calls table, the signatures view
(from the stats files) and `stats()["written"]` count the same calls, and every loss is counted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from capture import open_store

ROOT = Path(__file__).resolve().parents[1]

ADD = """
import json, os, sys, time, torch
from capture import Recorder
class Add(torch.nn.Module):
    def forward(self, x, y):
        return x + y
"""


def _default_signals() -> None:
    """The child starts with SIGHUP and SIGTERM at their defaults, as a server does.

    A test run launched under ``nohup`` (or any launcher that ignores SIGHUP) passes SIG_IGN on
    to its children, and a recorder rightly chains to it: the process would live on and the
    signal tests would time out for a reason that is not the recorder's.
    """
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _run(code: str, timeout: float = 120) -> tuple[int, str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        preexec_fn=_default_signals,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _start(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        preexec_fn=_default_signals,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _counts(store: Path) -> dict[str, Any]:
    """Calls rows, distinct call ids, the signatures view's total, and orphan calls."""
    with open_store(store) as s:
        row = s.query("SELECT count(*) AS n, count(DISTINCT call_id) AS i FROM calls").to_pylist()
        calls, ids = row[0]["n"], row[0]["i"]
        sigs = s.query("SELECT coalesce(sum(calls), 0) AS n FROM signatures").to_pylist()[0]["n"]
        orphans = s.query(
            "SELECT count(*) AS n FROM calls WHERE in_structure NOT IN "
            "(SELECT structure_id FROM structures)"
        ).to_pylist()[0]["n"]
    return {"calls": calls, "ids": ids, "signatures": sigs, "orphans": orphans}


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_of_an_idle_recorder_loses_no_call(tmp_path: Path, sig: signal.Signals) -> None:
    store, ready = tmp_path / "store", tmp_path / "ready"
    proc = _start(
        ADD
        + f"""
rec = Recorder(Add(), {str(store)!r}, flush_seconds=3600).start()
for i in range(1000):
    rec.model(torch.ones(1 + i % 5, 3), torch.ones(1 + i % 5, 3))
open({str(ready)!r}, "w").close()
time.sleep(120)
"""
    )
    _wait_for(ready)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -sig, err  # the process still dies of the signal
    assert _counts(store) == {"calls": 1000, "ids": 1000, "signatures": 1000, "orphans": 0}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_of_a_busy_recorder_loses_no_call(tmp_path: Path, sig: signal.Signals) -> None:
    store, made = tmp_path / "store", tmp_path / "made"
    proc = _start(
        ADD
        + f"""
fd = os.open({str(made)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
class Counted(Add):
    def forward(self, x, y):
        os.write(fd, b"x")  # one byte per call the model made
        return x + y
m = Counted()
rec = Recorder(m, {str(store)!r}, flush_seconds=3600).start()
i = 0
while True:
    m(torch.ones(1 + i % 5, 3), torch.ones(1 + i % 5, 3))
    i += 1
"""
    )
    deadline = time.monotonic() + 60
    while not made.exists() or made.stat().st_size < 2000:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -sig, err
    calls = made.stat().st_size
    counts = _counts(store)
    # The handler runs between two bytecodes of the loop: a call it interrupted inside the
    # wrapper, after the model ran, never returned to the caller and may be missing.
    assert calls - 1 <= counts["calls"] <= calls, (calls, counts)
    assert counts["calls"] == counts["ids"] == counts["signatures"] and counts["orphans"] == 0


def test_signal_chains_to_the_servers_own_handler(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
import signal
seen = []
signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
rec = Recorder(Add(), {str(store)!r}, flush_seconds=3600).start()
for i in range(10):
    rec.model(torch.ones(2, 3), torch.ones(2, 3))
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.5)
written = rec.stats()["written"]
rec.stop()
print(json.dumps({{"seen": seen, "written": written,
                   "restored": signal.getsignal(signal.SIGTERM) is not None
                   and signal.getsignal(signal.SIGTERM).__name__ == "<lambda>"}}))
"""
    )
    assert code == 0, err
    # The server's handler ran (the process lived on), after the recorder flushed; stop()
    # put the server's handler back.
    assert json.loads(out) == {"seen": [signal.SIGTERM], "written": 10, "restored": True}


def test_fork_child_writes_its_own_calls_under_its_own_names(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
m = Add()
rec = Recorder(m, {str(store)!r}, flush_seconds=3600).start()
for i in range(50):
    m(torch.ones(2, 3), torch.ones(2, 3))
pid = os.fork()
if pid == 0:
    for i in range(30):
        m(torch.ones(4, 3), torch.ones(4, 3))
    rec.stop()
    os._exit(0 if rec.stats()["written"] == 30 else 3)
_, status = os.waitpid(pid, 0)
for i in range(20):
    m(torch.ones(3, 3), torch.ones(3, 3))
rec.stop()
print(json.dumps({{"child": pid, "status": status, "written": rec.stats()["written"]}}))
""",
        timeout=180,
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == 0 and result["written"] == 70
    with open_store(store) as s:
        by_pid = s.query("SELECT pid, count(*) AS n FROM calls GROUP BY pid ORDER BY n").to_pylist()
    assert by_pid == [
        {"pid": result["child"], "n": 30},  # the child's own calls only
        {"pid": by_pid[1]["pid"], "n": 70},  # the parent's 50 + 20, none written twice
    ]
    child_files = [p for p in store.rglob("*.parquet") if f"-{result['child']}-" in p.name]
    assert child_files  # under a prefix naming the child's pid
    assert _counts(store) == {"calls": 100, "ids": 100, "signatures": 100, "orphans": 0}


def test_fork_child_keeps_its_own_payloads(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
from capture.store.payload_files import list_payloads
m = Add()
rec = Recorder(m, {str(store)!r}, flush_seconds=3600, payloads=1.0).start()
for i in range(3):
    m(torch.ones(2, 3), torch.ones(2, 3))
pid = os.fork()
if pid == 0:
    for i in range(4):
        m(torch.ones(4, 3), torch.ones(4, 3))
    rec.stop()
    os._exit(0 if rec.stats()["payloads"] == 4 else 3)
_, status = os.waitpid(pid, 0)
rec.stop()
names = [p.path.rsplit("/", 1)[-1] for p in list_payloads({str(store)!r})]
print(json.dumps({{"child": pid, "status": status, "names": names}}))
""",
        timeout=180,
    )
    assert code == 0, err
    result = json.loads(out)
    # a forked child has no copy of the parent's writer thread, so it writes its own sampled
    # calls itself, under its own pid.
    assert result["status"] == 0
    mine = [n for n in result["names"] if f"-{result['child']}-" in n]
    assert len(mine) == 4 and len(result["names"]) == 7


_COMPILED = """
import json, sys, tempfile, torch
from torch._dynamo.utils import counters
from capture import Recorder
backend, order, store = sys.argv[1], sys.argv[2], sys.argv[3]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
calls = []
model.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape))
xs = [torch.randn(3, 4) for _ in range(27)]
with torch.no_grad():
    reference = [model(x) for x in xs]
calls.clear()
if order == "wrap-then-compile":
    rec = Recorder(model, store).start()
    compiled = torch.compile(model, backend=backend)
else:
    compiled = torch.compile(model, backend=backend)
    rec = Recorder(model, store).start()
with torch.no_grad():
    outs = [compiled(xs[i]) for i in range(3)]
    frames = counters["frames"]["total"]
    outs += [compiled(x) for x in xs[3:]]
rec.stop()
print(json.dumps({
    "equal": all(torch.equal(a, b) for a, b in zip(outs, reference)),
    "hook": len(calls), "written": rec.stats()["written"],
    "new_frames": counters["frames"]["total"] - frames,
}))
"""


def _compiled(tmp_path: Path, backend: str, order: str) -> dict[str, Any]:
    store = tmp_path / "store"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", _COMPILED, backend, order, str(store)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    result["store"] = _counts(store)
    return result


@pytest.mark.parametrize("order", ["wrap-then-compile", "compile-then-wrap"])
def test_compiled_model_calls_are_recorded_eager_backend(tmp_path: Path, order: str) -> None:
    result = _compiled(tmp_path, "eager", order)
    # Every call the model received (a forward pre-hook's count) is recorded, outputs are
    # unchanged, and after the first calls no frame is compiled again.
    assert result["hook"] == 27 and result["written"] == 27, result
    assert result["equal"] is True and result["new_frames"] == 0, result
    assert result["store"] == {"calls": 27, "ids": 27, "signatures": 27, "orphans": 0}


@pytest.mark.slow
@pytest.mark.parametrize("order", ["wrap-then-compile", "compile-then-wrap"])
def test_compiled_model_calls_are_recorded_inductor(tmp_path: Path, order: str) -> None:
    result = _compiled(tmp_path, "inductor", order)
    assert result["hook"] == 27 and result["written"] == 27, result
    assert result["new_frames"] == 0, result
    assert result["store"] == {"calls": 27, "ids": 27, "signatures": 27, "orphans": 0}


@pytest.mark.slow
@pytest.mark.parametrize("order", ["wrap-then-compile", "compile-then-wrap"])
def test_compiled_tiny_llama_generate_is_recorded(tmp_path: Path, order: str) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        f"""
        import json, torch
        from capture import Recorder
        from fixtures.models import run_generate, tiny_llama
        model = tiny_llama()
        calls = []
        model.register_forward_pre_hook(lambda m, a, k: calls.append(1), with_kwargs=True)
        reference = run_generate(model, [(2, 5)], max_new_tokens=4)
        calls.clear()
        if {order!r} == "wrap-then-compile":
            rec = Recorder(model, {str(store)!r}).start()
            model.compile(backend="eager")
        else:
            model.compile(backend="eager")
            rec = Recorder(model, {str(store)!r}).start()
        outs = run_generate(model, [(2, 5)], max_new_tokens=4)
        rec.stop()
        print(json.dumps({{"hook": len(calls), "written": rec.stats()["written"],
                          "equal": all(torch.equal(a, b) for a, b in zip(outs, reference))}}))
        """,
        timeout=900,
    )
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    # generate() called the compiled model 4 times (prefill + 3 decode steps): all recorded.
    assert result == {"hook": 4, "written": 4, "equal": True}


def test_disk_full_keeps_calls_signatures_written_equal(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
import random, resource, signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill, as a server would
class Wide(torch.nn.Module):
    def forward(self, *xs):
        return xs[0]
m = Wide()
rec = Recorder(m, {str(store)!r}, flush_rows=100_000, flush_seconds=3600).start()
rng = random.Random(0)
limit = resource.getrlimit(resource.RLIMIT_FSIZE)
for round in range(4):
    for i in range(100):
        m(torch.ones(2, 3))
    rec.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, limit[1]))  # the disk is full
    for i in range(1000):  # random sizes: ~40 KB of entropy, no file of these fits in 16 KB
        m(*[torch.ones(1 + rng.randrange(13), 1 + rng.randrange(17)) for j in range(20)])
    rec.flush()
    resource.setrlimit(resource.RLIMIT_FSIZE, limit)
rec.stop()
print(json.dumps(rec.stats()))
""",
        timeout=300,
    )
    assert code == 0, err
    stats = json.loads(out)
    assert stats["written"] == 400 and stats["dropped"] == 4000, stats  # every loss counted
    assert _counts(store) == {"calls": 400, "ids": 400, "signatures": 400, "orphans": 0}


def test_segment_whose_stats_file_fails_leaves_no_calls_file(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
import pathlib
m = Add()
rec = Recorder(m, {str(store)!r}, flush_seconds=3600).start()
stats = pathlib.Path({str(store)!r}) / "stats" / "model=Add"
for round in range(4):
    for i in range(100):
        m(torch.ones(2, 3), torch.ones(2, 3))
    rec.flush()
    # Folders where the next stats files should land: their rename fails, the calls files'
    # (same names, another folder) succeed: a half-written segment.
    # The writer's next file number: one more than the newest of its files (read from the
    # files, not from the repr of the writer's counter).
    w = rec._writer
    files = pathlib.Path({str(store)!r}).rglob(w.prefix + "-*.parquet")
    numbers = [int(p.stem.rsplit("-", 1)[1]) for p in files]
    seq = max(numbers) + 1
    blocked = [stats / f"{{w.prefix}}-{{n:06d}}.parquet" for n in range(seq, seq + 3)]
    for b in blocked:
        b.mkdir()
    for i in range(300):
        m(torch.ones(1 + i, 3), torch.ones(1 + i, 3))
    rec.flush()
    for b in blocked:
        b.rmdir()
rec.stop()
print(json.dumps(rec.stats()))
""",
        timeout=300,
    )
    assert code == 0, err
    stats = json.loads(out)
    assert stats["dropped"] == 1200 and stats["written"] == 400, stats
    # The calls files of the failed segments are written, then deleted again: calls counted
    # dropped are never visible.
    assert _counts(store) == {"calls": 400, "ids": 400, "signatures": 400, "orphans": 0}


def test_store_removed_while_recording_rewrites_structures(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
import shutil
m = Add()
rec = Recorder(m, {str(store)!r}, flush_seconds=3600).start()
m(torch.ones(2, 3), torch.ones(2, 3))
rec.flush()
shutil.rmtree({str(store)!r})  # a cleanup job
for i in range(301):
    m(torch.ones(2, 3), torch.ones(2, 3))
rec.stop()
print(json.dumps(rec.stats()))
"""
    )
    assert code == 0, err
    stats = json.loads(out)
    assert stats["store_resets"] == 1 and stats["written"] == 302, stats  # visible
    assert "capture: failed finding the store's structures" in err
    # The 301 later calls have their structures again: none is an orphan.
    assert _counts(store) == {"calls": 301, "ids": 301, "signatures": 301, "orphans": 0}


def test_poison_record_is_dropped_alone(tmp_path: Path) -> None:
    store = tmp_path / "store"
    code, out, err = _run(
        ADD
        + f"""
class Fails(torch.nn.Module):
    def forward(self, x):
        if x.shape[0] == 7:
            raise ValueError("bad \\ud800 byte")  # Arrow cannot hold a lone surrogate
        return x
m = Fails()
rec = Recorder(m, {str(store)!r}, flush_rows=1000, flush_seconds=3600).start()
for i in range(101):
    try:
        m(torch.ones(7 if i == 50 else 2, 3))
    except ValueError:
        pass
rec.stop()
print(json.dumps(rec.stats()))
"""
    )
    assert code == 0, err
    stats = json.loads(out)
    # One record the writer cannot convert: it alone is dropped and counted.
    assert stats["bad_records"] == 1 and stats["dropped"] == 1, stats
    assert stats["recorded"] == 101 and stats["written"] == 100, stats
    assert err.count("capture: failed converting a call record") == 1
    assert _counts(store) == {"calls": 100, "ids": 100, "signatures": 100, "orphans": 0}
