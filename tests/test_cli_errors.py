"""Path mistakes a new user makes: one ``Error:`` line naming the thing and the fix,
exit status 1, no traceback, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
from capture.cli.main import cli


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("errors") / "capture-store"
    model = torch.nn.Linear(2, 2)
    with capture.Recorder(model, root, name="linear"):
        model(torch.randn(1, 2))
    return root


def _run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("where", ["missing-folder", "a-folder"])
def test_report_out_in_a_missing_folder_or_a_folder(
    store: Path, tmp_path: Path, where: str
) -> None:
    # A real process: its stderr is what a user sees (a 31-line traceback before, and a
    # 170 KiB <folder>.tmp left behind).
    work = tmp_path / "work"
    work.mkdir()
    out = work / "missing" / "r.html" if where == "missing-folder" else work
    done = subprocess.run(
        [sys.executable, "-m", "capture.cli", "--store", str(store), "report", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) <= 2 and lines[-1].startswith("Error: --out "), done.stderr
    assert "Traceback" not in done.stderr
    assert list(tmp_path.rglob("*")) == [work]  # nothing written, no .tmp anywhere


def test_report_out_in_a_missing_folder_says_which(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "missing" / "r.html"
    assert _run("--store", str(store), "report", "--out", str(out)) == (
        1,
        "",
        f"Error: --out {out}: the folder {out.parent} does not exist; create the folder first "
        "or write the page elsewhere\n",
    )


def test_report_out_a_folder_says_to_name_the_page(store: Path, tmp_path: Path) -> None:
    assert _run("--store", str(store), "report", "--out", str(tmp_path)) == (
        1,
        "",
        f"Error: --out {tmp_path} is a folder; name the page to write, e.g. --out "
        f"{tmp_path / 'report.html'}\n",
    )


def test_store_that_is_a_file(tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    page.write_text("<html></html>")
    # a file is named as a file, not as a missing store.
    assert _run("--store", str(page), "summary") == (
        1,
        "",
        f"Error: {page} is a file, not a store; a store is the folder capture.Recorder writes "
        "(e.g. ./capture-store): pass that folder as --store\n",
    )


@pytest.mark.parametrize("inner", ["calls", "stats/model=linear", "structures"])
def test_store_inside_a_store(store: Path, inner: str) -> None:
    # `--store capture-store/calls` names the store it is inside, not an empty store.
    assert _run("--store", f"{store}/{inner}", "dims") == (
        1,
        "",
        f"Error: {store}/{inner} is inside the store at {store}, not a store itself; pass the "
        f"store's folder: --store {store}\n",
    )


def test_a_store_in_a_folder_named_like_a_table_opens(tmp_path: Path) -> None:
    root = tmp_path / "stats"  # a store may live anywhere, even in a folder called stats
    model = torch.nn.Linear(2, 2)
    with capture.Recorder(model, root, name="linear"):
        model(torch.randn(1, 2))
    code, out, err = _run("--store", str(root), "query", "SELECT count(*) AS n FROM calls")
    assert (code, out, err) == (0, "n\n-\n1\n", "")


def test_check_of_a_store_folder(store: Path) -> None:
    # `capture check capture-store` says it was given a store, not only "no artifact".
    assert _run("--store", str(store), "check", str(store)) == (
        1,
        "",
        f"Error: {store} is a store, not an artifact; pass the .pt2 that capture export --out "
        f"wrote, and the store before the command: capture --store {store} check MODEL.pt2\n",
    )


def test_check_of_another_folder(store: Path, tmp_path: Path) -> None:
    assert _run("--store", str(store), "check", str(tmp_path)) == (
        1,
        "",
        f"Error: {tmp_path} is a folder, not an artifact; pass the .pt2 that capture export "
        f"--out wrote (the store is {store}, set with capture --store)\n",
    )


def test_demo_into_a_file_or_inside_a_store(store: Path, tmp_path: Path) -> None:
    page = tmp_path / "r.html"
    page.write_text("<html></html>")
    code, out, err = _run("demo", "--store", str(page))
    assert (code, out) == (1, "")
    assert err.startswith(f"Error: {page} is a file, not a store;")  # a traceback before
    code, out, err = _run("demo", "--store", f"{store}/calls")
    assert (code, out) == (1, "")
    assert err.startswith(f"Error: {store}/calls is inside the store at {store},")
    assert sorted(p.name for p in (store / "calls").iterdir()) == ["model=linear"]
