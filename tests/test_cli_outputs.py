"""Every command driven into a missing and a read-only output path: one ``Error:`` line naming
the path, exit status 1, no traceback, before any work; the library's save raises
`OutputNotWritable`.

Commands that write (export --out, report --out, demo --store, compact, payloads --delete-*)
are refused before their work starts. Commands that only read are driven into a missing store
(one line) and a read-only store (they work: reading never needs to write). Read-only is made
real for root too (`tests.unwritable.read_only`: the immutable attribute as root, permission
bits otherwise), and tried before the command runs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from unwritable import full_filesystem, read_only, read_only_filesystem

import replay
from capture.cli.main import COMMANDS, cli
from capture.errors import OutputNotWritable
from fixtures.models import tiny_llama

FACTORY = "fixtures.models:tiny_llama"

# Command -> its arguments writing under OUT ("{out}"), or None for a command that only reads.
WRITES_UNDER: dict[str, list[str] | None] = {
    "export": ["export", FACTORY, "--group", "decode", "--out", "{out}/model.pt2"],
    "report": ["report", "--out", "{out}/report.html"],
    "demo": ["demo", "--store", "{out}/store"],
    "compact": None,  # rewrites the store itself: see STORE_WRITERS
    "payloads": None,
    "query": None,
    "summary": None,
    "dims": None,
    "profiles": None,
    "buckets": None,
    "check": None,
}
STORE_WRITERS: dict[str, list[str]] = {
    "compact": ["compact"],
    "payloads": ["payloads", "--delete-all"],
}
READERS: dict[str, list[str]] = {
    "query": ["query", "SELECT count(*) AS n FROM calls"],
    "summary": ["summary"],
    "dims": ["dims"],
    "profiles": ["profiles"],
    "buckets": ["buckets", "--budget", "4"],
    "check": ["check", "{artifact}"],
}
FILE_WRITERS = [name for name, argv in WRITES_UNDER.items() if argv is not None]


def test_every_command_is_driven_here() -> None:
    # A new command must say here whether and where it writes.
    assert set(WRITES_UNDER) == set(COMMANDS)
    assert set(STORE_WRITERS) | set(READERS) | set(FILE_WRITERS) == set(COMMANDS)


def _invoke(argv: list[str]) -> Result:
    return CliRunner(env={"CAPTURE_STORE": None}).invoke(cli, argv, prog_name="capture")


def _one_error_line(result: Result, *names: str) -> str:
    """The run ended on one ``Error:`` line naming `names`, exit 1, stdout empty, no traceback."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("a traceback") from result.exception
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def exported(llama_root: Path) -> replay.ExportResult:
    return replay.export(tiny_llama(), llama_root, groups=["decode"], probes=0)


@pytest.fixture(scope="module")
def artifact(exported: replay.ExportResult, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(exported.save(tmp_path_factory.mktemp("artifact") / "model.pt2"))


@pytest.fixture
def store_copy(llama_root: Path, tmp_path: Path) -> Path:
    """A copy of the tiny-Llama store that a test may make read-only."""
    return Path(shutil.copytree(llama_root, tmp_path / "store"))


def _argv(name: str, out: Path, store: Path) -> list[str]:
    argv = WRITES_UNDER[name]
    assert argv is not None
    argv = [a.replace("{out}", str(out)) for a in argv]
    return argv if name == "demo" else ["--store", str(store), *argv]


@pytest.mark.parametrize("name", FILE_WRITERS)
def test_writer_into_a_missing_folder(name: str, llama_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "missing"
    if name == "demo":  # the demo creates a missing store with its parents: a file blocks it
        (tmp_path / "a-file").write_text("")
        out = tmp_path / "a-file" / "missing"
        line = _one_error_line(_invoke(_argv(name, out, llama_root)), str(out))
        assert line.endswith("is a file, not a folder; write the store elsewhere")
    else:
        line = _one_error_line(_invoke(_argv(name, out, llama_root)), str(out))
        assert f"the folder {out} does not exist; create the folder first" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == (["a-file"] if name == "demo" else [])


@pytest.mark.parametrize("name", FILE_WRITERS)
def test_writer_under_a_file(name: str, llama_root: Path, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file"
    line = _one_error_line(_invoke(_argv(name, out, llama_root)), str(out))
    assert f"{out} is a file, not a folder; write the " in line


@pytest.mark.parametrize("name", FILE_WRITERS)
def test_writer_into_a_read_only_folder(name: str, llama_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "read-only"
    out.mkdir()
    with read_only(out):
        line = _one_error_line(_invoke(_argv(name, out, llama_root)), str(out))
    assert f"the folder {out} is not writable (" in line
    assert line.endswith("; make it writable or write the " + line.rsplit("write the ", 1)[1])
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("name", FILE_WRITERS)
def test_writer_onto_a_read_only_filesystem(name: str, llama_root: Path, tmp_path: Path) -> None:
    # report --out here gave two tracebacks: the write, then the cleanup of its temporary file
    with read_only_filesystem(tmp_path / "ro-fs") as out:
        line = _one_error_line(_invoke(_argv(name, out, llama_root)), str(out))
    assert f"{out} is on a read-only filesystem; write the " in line


def test_demo_into_a_read_only_folder_as_its_store(tmp_path: Path) -> None:
    with read_only(tmp_path):
        line = _one_error_line(_invoke(["demo", "--store", str(tmp_path)]), str(tmp_path))
    assert line.endswith("make it writable or write the store elsewhere")


@pytest.mark.parametrize("name", sorted(STORE_WRITERS))
def test_store_writer_on_a_read_only_store(name: str, store_copy: Path) -> None:
    before = sorted(p.relative_to(store_copy) for p in store_copy.rglob("*"))
    with read_only(store_copy):
        line = _one_error_line(_invoke(["--store", str(store_copy), *STORE_WRITERS[name]]))
    assert line.startswith(f"Error: --store {store_copy}: the folder {store_copy} is not writable")
    assert line.endswith("); make it writable first")
    assert sorted(p.relative_to(store_copy) for p in store_copy.rglob("*")) == before


@pytest.mark.parametrize("name", sorted(STORE_WRITERS) + sorted(READERS))
def test_command_on_a_missing_store(name: str, tmp_path: Path, artifact: Path) -> None:
    store = tmp_path / "no-store"
    argv = {**STORE_WRITERS, **READERS}[name]
    argv = [a.replace("{artifact}", str(artifact)) for a in argv]
    _one_error_line(_invoke(["--store", str(store), *argv]), str(store))
    assert not store.exists()


@pytest.mark.parametrize("name", sorted(READERS))
def test_reader_on_a_read_only_store(name: str, store_copy: Path, artifact: Path) -> None:
    argv = [a.replace("{artifact}", str(artifact)) for a in READERS[name]]
    with read_only(store_copy), read_only(artifact.parent):
        result = _invoke(["--store", str(store_copy), *argv])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError("a traceback") from result.exception
    # check: 3, the artifact serves the decode group only (the table says which calls not)
    assert result.exit_code == (3 if name == "check" else 0), result.output
    assert result.stdout != ""


def test_export_out_checked_before_the_export_in_a_real_process(
    llama_root: Path, tmp_path: Path
) -> None:
    # What a user sees: one line on stderr, nothing on stdout, before torch.export runs (the
    # export of the store's groups would print a coverage table and take much longer).
    out = tmp_path / "nowhere" / "x.pt2"
    done = subprocess.run(
        [sys.executable, "-m", "capture.cli", "--store", str(llama_root), "export", FACTORY]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"Error: --out {out}: the folder {out.parent} does not exist; create the folder first "
        "or write the artifact elsewhere\n"
    )


@pytest.mark.parametrize("where", ["missing", "read-only"])
def test_export_result_save_raises_output_not_writable(
    exported: replay.ExportResult, tmp_path: Path, where: str
) -> None:
    folder = tmp_path / where
    target = folder / "model.pt2"
    if where == "missing":
        with pytest.raises(OutputNotWritable, match=f"the folder {folder} does not exist"):
            exported.save(target)
    else:
        folder.mkdir()
        with read_only(folder), pytest.raises(OutputNotWritable, match="is not writable"):
            exported.save(target)
        assert list(folder.iterdir()) == []


@pytest.mark.parametrize("name", FILE_WRITERS)
def test_writer_onto_a_full_filesystem(name: str, llama_root: Path, tmp_path: Path) -> None:
    with full_filesystem(tmp_path / "full") as out:
        line = _one_error_line(_invoke(_argv(name, out, llama_root)), str(out))
        assert sorted(p.name for p in out.iterdir()) == ["filler"]
    assert f"no space left on the filesystem of {out}; free some space" in line


def test_export_onto_a_filesystem_smaller_than_the_weights(
    llama_root: Path, tmp_path: Path
) -> None:
    # The tiny Llama's weights take 353.3 KiB; the artifact holds each once.
    with full_filesystem(tmp_path / "small", size_kib=256, fill=False) as out:
        line = _one_error_line(_invoke(_argv("export", out, llama_root)), str(out))
        assert list(out.iterdir()) == []
    assert line == (
        f"Error: --out {out}/model.pt2: the filesystem of {out} has 256.0 KiB free, the "
        "artifact needs about 353.3 KiB; free some space or write the artifact elsewhere"
    )


def test_report_write_on_a_read_only_filesystem_is_one_error(tmp_path: Path) -> None:
    # The write itself (reached when the filesystem turns read-only after the check): its
    # temporary file's cleanup fails too, and must not raise a second error.
    from capture.cli.report import _write

    with read_only_filesystem(tmp_path / "ro-fs") as out:
        with pytest.raises(OutputNotWritable) as caught:
            _write(out / "r.html", "<html></html>")
    assert str(caught.value) == (
        f"--out {out}/r.html: {out} is on a read-only filesystem; write the page elsewhere"
    )
    assert list(out.iterdir()) == []


@pytest.mark.parametrize("name", sorted(STORE_WRITERS))
def test_store_writer_on_a_full_filesystem(name: str, llama_root: Path, tmp_path: Path) -> None:
    with full_filesystem(tmp_path / "full", content=llama_root) as store:
        before = sorted(p.relative_to(store) for p in store.rglob("*"))
        line = _one_error_line(_invoke(["--store", str(store), *STORE_WRITERS[name]]))
        assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
    assert line == (
        f"Error: --store {store}: no space left on the filesystem of {store}; free some space first"
    )
