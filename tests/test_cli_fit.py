"""Tables that fit the terminal: cli/fit.py, and the commands in a real pseudo-terminal.

On a terminal a table leaves out identifier columns and shortens long cells with an ellipsis;
piped, and in every other format, it carries every column in full. The commands are run in a
pseudo-terminal of 100 columns (no $COLUMNS: the width comes from the terminal itself).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pyarrow as pa
import pytest
from click.testing import CliRunner

from capture.cli.demo import DEMO_MODEL, MAX_NEW_TOKENS, WORKLOAD
from capture.cli.fit import Fit, cut, layout
from capture.cli.main import cli
from capture.cli.output import render, table_text

COLUMNS = 100


# -- the layout -----------------------------------------------------------------------------------
def test_identifier_columns_are_left_out_on_a_terminal_only() -> None:
    names = ["structure_id", "path", "n"]
    assert layout(names, [16, 10, 3], [False, False, True], 80, hide=["structure_id"]).shown == [
        1,
        2,
    ]
    assert layout(names, [16, 10, 3], [False, False, True], None, hide=["structure_id"]).shown == [
        0,
        1,
        2,
    ]


def test_the_widest_text_columns_shrink_together_and_numbers_never() -> None:
    fitted = layout(["a", "b", "n"], [30, 12, 9], [False, False, True], 35)
    # room 35 - 4 of separators = 31: the number keeps 9, the text columns share 22.
    assert fitted.widths == [11, 11, 9]


def test_columns_that_cannot_fit_are_dropped_from_the_right() -> None:
    fitted = layout(["a", "b", "c"], [20, 20, 20], [True, True, True], 30)
    assert (fitted.shown, fitted.dropped) == ([0], ["b", "c"])


@pytest.mark.parametrize(
    ("text", "size", "keep_end", "expected"),
    [
        ("decode_no_attention_mask", 10, False, "decode_no…"),
        ("kwargs['past_key_values'].key_cache[0]", 22, True, "kwargs[…].key_cache[0]"),
        ("日本語のテキスト", 7, False, "日本語…"),
        ("short", 10, False, "short"),
    ],
)
def test_cut(text: str, size: int, keep_end: bool, expected: str) -> None:
    assert cut(text, size, keep_end) == expected


# -- the renderer ---------------------------------------------------------------------------------
ROWS = [
    {"structure_id": "068d1f09d2d67dfb", "path": "kwargs['past_key_values'].key_cache[0]", "n": 1}
]


def test_a_fitted_table_shortens_cells_and_leaves_out_identifiers() -> None:
    fit = Fit(width=30, hide=("structure_id",), keep_end=("path",))
    assert table_text(ROWS, fit=fit) == (
        "path                         n\n"
        "---------------------------  -\n"
        "kwargs['…ues'].key_cache[0]  1"
    )


def test_the_same_table_piped_has_every_column_in_full() -> None:
    assert table_text(ROWS, fit=Fit()) == (
        "structure_id      path                                    n\n"
        "----------------  --------------------------------------  -\n"
        "068d1f09d2d67dfb  kwargs['past_key_values'].key_cache[0]  1"
    )


def _stream(*batches: list[str]) -> pa.RecordBatchReader:
    schema = pa.schema([("s", pa.string())])
    return pa.RecordBatchReader.from_batches(
        schema, [pa.record_batch([pa.array(b)], schema=schema) for b in batches]
    )


@pytest.mark.parametrize(
    ("width", "last"), [(None, "a much longer cell"), (10, "a much lo…")], ids=["piped", "terminal"]
)
def test_a_stream_is_sized_on_its_first_batch(
    width: int | None, last: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # duckdb's convention: widths from the first rows; later, a longer cell runs over its
    # column when piped (nothing lost) and is shortened on a terminal.
    # One batch of 1,025 rows (DuckDB's are 8,192): the widths come from its first 1,024.
    render(_stream(["x" * 10] * 1024 + ["a much longer cell"]), fit=Fit(width))
    lines = capsys.readouterr().out.splitlines()
    assert lines[:3] + lines[-1:] == ["s", "-" * 10, "x" * 10, last]


def test_dropping_a_column_says_so_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    render([{"a": 10**30, "b": 10**30}], fit=Fit(40))
    out, err = capsys.readouterr()
    assert out.splitlines()[0].strip() == "a"
    assert err == "note: 1 column(s) left out to fit the terminal: b (--wide shows them)\n"


# -- the commands in a pseudo-terminal ----------------------------------------------------------
@pytest.fixture(scope="module")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's traffic (tiny Llama, `capture demo`'s workload), without its export."""
    from capture.demo_model import run_generate, tiny_llama
    from capture.record.recorder import Recorder

    root = tmp_path_factory.mktemp("demo-traffic") / "store"
    model = tiny_llama(seed=0)
    with Recorder(model, root, name=DEMO_MODEL, flush_seconds=3600):
        run_generate(model, WORKLOAD, max_new_tokens=MAX_NEW_TOKENS)
    return root


def _in_terminal(args: list[str]) -> tuple[int, str]:
    """Runs ``capture ARGS`` with stdout a pseudo-terminal of `COLUMNS` columns."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, COLUMNS, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "CAPTURE_STORE")}
    code = "from capture.cli.main import cli; cli()"
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=slave, stderr=subprocess.PIPE, env=env
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal's other end closed: everything was read
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert process.wait(timeout=120) == 0, process.stderr.read() if process.stderr else ""
    if process.stderr:
        process.stderr.close()
    return process.returncode, b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.mark.parametrize("command", ["summary", "dims", "profiles"])
def test_a_100_column_terminal_gets_no_wider_line(demo_store: Path, command: str) -> None:
    _, out = _in_terminal(["--store", str(demo_store), command])
    widths = [len(line) for line in out.splitlines()]
    assert widths and max(widths) <= COLUMNS, out
    piped = CliRunner().invoke(cli, ["--store", str(demo_store), command]).stdout
    assert max(len(line) for line in piped.splitlines()) > COLUMNS  # fitting did something


@pytest.mark.parametrize("command", ["summary", "dims", "profiles"])
def test_json_in_a_terminal_still_gives_every_field(demo_store: Path, command: str) -> None:
    _, out = _in_terminal(["--store", str(demo_store), command, "-f", "json"])
    piped = CliRunner().invoke(cli, ["--store", str(demo_store), command, "-f", "json"])
    assert json.loads(out) == json.loads(piped.stdout)
    if command == "dims":
        assert {"structure_id", "leaf", "argument", "model"} <= set(json.loads(out)[0])


def test_wide_in_a_terminal_prints_what_a_pipe_gets(demo_store: Path) -> None:
    _, out = _in_terminal(["--store", str(demo_store), "dims", "--wide"])
    piped = CliRunner().invoke(cli, ["--store", str(demo_store), "dims"]).stdout
    assert out == piped


def test_copied_names_stay_whole_while_prose_shrinks() -> None:
    names = ["group", "inputs", "n"]
    fitted = layout(names, [25, 40, 3], [False, False, True], 50, keep=["group"])
    assert fitted.widths == [25, 50 - 25 - 3 - 2 * 2, 3]
    assert fitted.dropped == []


def test_the_least_needed_columns_go_before_a_copied_name_is_cut() -> None:
    names = ["group", "path", "dynamic", "calls", "symbol"]
    natural = [25, 30, 7, 5, 17]
    fitted = layout(
        names, natural, [False, False, False, True, False], 58, keep=["group", "symbol"],
        drop_first=["dynamic", "calls"],
    )  # fmt: skip
    assert [names[i] for i in fitted.shown] == ["group", "path", "symbol"]
    assert fitted.widths == [25, 58 - 25 - 17 - 2 * 2, 17]
    assert fitted.dropped == ["dynamic", "calls"]


def test_copied_names_are_cut_last_then_columns_leave_from_the_right() -> None:
    fitted = layout(["group", "symbol"], [25, 17], [False, False], 30, keep=["group", "symbol"])
    assert fitted.widths == [14, 14] and fitted.dropped == []
    fitted = layout(["group", "symbol", "n"], [25, 17, 9], [False, False, True], 16, keep=["group"])
    assert [fitted.dropped, fitted.widths] == [["n"], [7, 7]]


def _cells(out: str) -> set[str]:
    return {cell for line in out.splitlines() for cell in line.split("  ") if cell.strip()}


@pytest.mark.parametrize(
    ("command", "copied"),
    [
        ("dims", ("group", "symbol", "expr")),
        ("summary", ("group", "symbol", "expr")),
        ("profiles", ("input",)),
    ],
)
def test_a_100_column_terminal_keeps_the_names_the_next_command_needs(
    demo_store: Path, command: str, copied: tuple[str, ...]
) -> None:
    # symbol names for --symbol, the expressions and TensorRT input names are never cut
    _, out = _in_terminal(["--store", str(demo_store), command])
    data = json.loads(
        CliRunner().invoke(cli, ["--store", str(demo_store), command, "-f", "json"]).stdout
    )
    if command == "summary":
        [model] = data["models"]
        rows = [{"group": g["name"], **s} for g in model["groups"] for s in g["symbols"]] + [
            {"group": g["name"]} for g in model["groups"]
        ]
    else:
        rows = data
    wanted = {str(row[c]) for row in rows for c in copied if row.get(c) is not None}
    assert wanted and wanted <= {c.strip() for c in _cells(out)}, sorted(wanted - _cells(out))
    assert "…" in out  # something else was shortened to make room
