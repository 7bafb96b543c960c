"""The recorder in hostile conditions, in real subprocesses: SIGKILL, disk errors, import cost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pyarrow.parquet as pq

from capture import open_store

ROOT = Path(__file__).resolve().parents[1]


def _python(code: str, **kwargs: object) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,  # type: ignore[arg-type]
    )


def test_sigkill_leaves_only_readable_files(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    store = tmp_path / "store"
    flush_rows = 50
    proc = _python(
        f"""
        import os, torch, time
        from capture import Recorder
        class Add(torch.nn.Module):
            def forward(self, x, y):
                return x + y
        m = Add()
        rec = Recorder(m, {str(store)!r}, flush_rows={flush_rows}, flush_seconds=0.2).start()
        n = 0
        while True:
            m(torch.ones(1 + n % 7, 3), torch.ones(1 + n % 7, 3))
            n += 1
            if n % 10 == 0:  # atomically: a kill mid-write must not leave an empty file
                with open({str(progress) + ".tmp"!r}, "w") as f:
                    f.write(str(n))
                os.replace({str(progress) + ".tmp"!r}, {str(progress)!r})
            time.sleep(0.002)  # ~500 calls/s: the slack below is ~0.4 s of writer lag
        """
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        files = list(store.rglob("calls/**/*.parquet")) if store.exists() else []
        if len(files) >= 3:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    made = int(progress.read_text())  # calls made, give or take the last 9
    visible = [p for p in store.rglob("*.parquet") if not p.name.startswith(".")]
    assert visible
    for path in visible:  # every file a reader can see is complete
        assert pq.read_table(path).num_rows > 0
    con = duckdb.connect()
    (written,) = con.execute(
        f"SELECT count(*) FROM read_parquet('{store}/calls/**/*.parquet')"
    ).fetchall()[0]
    # Lost calls are the ones buffered since the last segment: at most flush_rows, plus what
    # arrived during one writer poll (50 ms) and the 9 calls the progress file may lag behind.
    lost = made - written
    assert -10 <= lost <= flush_rows + 200, (made, written)
    assert open_store(store).query("SELECT count(*) AS n FROM calls").to_pylist() == [
        {"n": written}
    ]


def test_disk_full_is_counted_and_earlier_files_survive(tmp_path: Path) -> None:
    store = tmp_path / "store"
    proc = _python(
        f"""
        import json, random, resource, signal, torch
        from capture import Recorder
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill, as a server would
        class Wide(torch.nn.Module):
            def forward(self, *xs):
                return xs[0] * 2
        m = Wide()
        rec = Recorder(m, {str(store)!r}, flush_rows=100_000, flush_seconds=3600).start()
        for i in range(5):
            m(torch.ones(2, 3))
        rec.flush()
        resource.setrlimit(resource.RLIMIT_FSIZE, (16_000, 16_000))
        ok = True
        rng = random.Random(0)  # random sizes: ~60 KB of entropy, no Parquet file fits in 16 KB
        for i in range(3000):
            xs = [torch.ones(1 + rng.randrange(13), 1 + rng.randrange(17)) for j in range(20)]
            ok &= bool(torch.equal(m(*xs), xs[0] * 2))
        rec.stop()
        print(json.dumps({{"ok": ok, **rec.stats()}}))
        """
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["ok"] is True
    assert stats["errors"] >= 1 and stats["dropped"] == 3000 and stats["written"] == 5
    assert err.count("capture: failed writing") == 1  # one clear warning, then counted
    assert "File too large" in err or "Errno 27" in err
    assert not [p for p in store.rglob("*") if p.is_file() and p.name.endswith(".tmp")]
    store_view = open_store(store)
    assert store_view.query("SELECT count(*) AS n FROM calls").to_pylist() == [{"n": 5}]


def test_import_capture_is_light() -> None:
    proc = _python(
        """
        import sys
        import capture
        heavy = [m for m in ("duckdb", "transformers", "matplotlib", "torch") if m in sys.modules]
        print(",".join(heavy))
        capture.Recorder
        heavy = [m for m in ("duckdb", "transformers", "matplotlib") if m in sys.modules]
        print(",".join(heavy))
        """
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["", ""]


def test_store_reading_does_not_import_torch(tmp_path: Path) -> None:
    import torch

    from capture import Recorder

    class Add(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    model = Add()
    with Recorder(model, tmp_path):
        model(torch.ones(2))
    proc = _python(
        f"""
        import sys
        import capture
        store = capture.open_store({str(tmp_path)!r})
        print(store.query("SELECT count(*) AS n FROM calls").to_pylist(), "torch" in sys.modules)
        """
    )
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip() == "[{'n': 1}] False"
