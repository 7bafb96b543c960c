"""The compaction lock is a lock (capture/store/compaction_lock.py): whatever else sits at
``<store>/.compact.lock`` (a FIFO, a link, a folder, a huge sparse file) is one error line or a
stale note taken over, never a hang, a read outside the store or a read of the whole file."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
from capture.cli.main import cli
from capture.record.recorder import Recorder
from capture.store import compaction_lock
from capture.store.compaction_lock import LOCK_NAME, MAX_NOTE, BadLock, read_note


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of three flushes (compaction has files to merge)."""
    store = tmp_path_factory.mktemp("lock") / "store"
    rec = Recorder(Add(), store, name="add", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(1, 4):
            rec.model(torch.ones(n, 3))
            rec.flush()
    return store


@pytest.fixture
def store(recorded: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "store"
    shutil.copytree(recorded, copy)
    return copy


def _fifo(lock: Path, outside: Path) -> None:
    os.mkfifo(lock)


def _link_out(lock: Path, outside: Path) -> None:
    outside.write_text('{"host": "elsewhere", "pid": 1, "since": 0}')
    os.symlink(outside, lock)


def _dangling_link(lock: Path, outside: Path) -> None:
    os.symlink(outside / "missing", lock)


def _folder(lock: Path, outside: Path) -> None:
    (lock / "inside").mkdir(parents=True)


NOT_A_LOCK: dict[str, tuple[Callable[[Path, Path], None], str]] = {
    "fifo": (_fifo, "a FIFO"),
    "link out of the store": (_link_out, "a symbolic link"),
    "dangling link": (_dangling_link, "a symbolic link"),
    "folder": (_folder, "a folder"),
}


@pytest.mark.parametrize("case", sorted(NOT_A_LOCK))
def test_what_is_not_a_lock_file_is_one_line_naming_it_and_the_fix(
    store: Path, tmp_path: Path, case: str
) -> None:
    plant, kind = NOT_A_LOCK[case]
    lock, outside = store / LOCK_NAME, tmp_path / "outside"
    plant(lock, outside)
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["--store", str(store), "compact"])
    assert time.monotonic() - started < 30  # a FIFO never blocks the compaction
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: {lock} is {kind}, not a lock file capture writes (compaction follows no "
        f"link and waits on nothing in a store); remove it (rm -r {lock}) and compact again\n"
    )
    assert os.path.lexists(lock)  # left for a person to look at
    with pytest.raises(BadLock):
        capture.compact(store)


def test_the_lock_is_opened_without_following_a_link_or_blocking(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock, outside = store / LOCK_NAME, tmp_path / "outside"
    _link_out(lock, outside)
    opened: list[tuple[str, int]] = []
    real_open = os.open

    def watched(path: str, flags: int, *args: int, **kwargs: int) -> int:
        opened.append((os.fspath(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(compaction_lock.os, "open", watched)
    with pytest.raises(BadLock, match="symbolic link"):
        capture.compact(store)
    monkeypatch.undo()
    flags = [f for path, f in opened if path == str(lock)]
    assert flags and all(f & os.O_NOFOLLOW and f & os.O_NOCTTY for f in flags)
    assert all(f & os.O_NONBLOCK for f in flags if not f & os.O_CREAT)
    assert os.readlink(lock) == str(outside)


def test_a_huge_sparse_lock_is_read_a_few_bytes_then_taken_over_when_old(store: Path) -> None:
    lock = store / LOCK_NAME
    with open(lock, "wb") as f:
        f.truncate(64 << 30)  # 64 GiB, no block written
    assert len(read_note(str(lock)) or b"") == MAX_NOTE + 1
    fresh = CliRunner().invoke(cli, ["--store", str(store), "compact"])
    assert fresh.exit_code == 1
    assert fresh.stderr == (
        f"Error: another compaction holds {lock} (no readable note); wait for it to finish\n"
    )
    os.utime(lock, (0, 0))  # an unreadable note a minute old is a dead compaction's
    old = CliRunner().invoke(cli, ["--store", str(store), "compact"])
    assert old.exit_code == 0, old.output
    assert not lock.exists()


def test_a_deeply_nested_note_is_an_unreadable_one(store: Path) -> None:
    lock = store / LOCK_NAME
    lock.write_bytes(b"[" * 2000 + b"]" * 2000)
    os.utime(lock, (0, 0))
    result = CliRunner().invoke(cli, ["--store", str(store), "compact"])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
