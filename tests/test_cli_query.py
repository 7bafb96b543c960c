"""`capture query`: SQL over a real store recorded from a tiny torch module, in every format."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import capture
from capture.cli.main import cli

INPUT_LEAVES = "SELECT path, kind, shape FROM leaves WHERE side = 'input' ORDER BY call_id, leaf"


class Toy(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return x * 2 if y is None else x + y


@pytest.fixture
def store(tmp_path: Path) -> str:
    """Three calls: x of 2x3; x and y of 4x3; x of 5x3."""
    model = Toy()
    path = tmp_path / "store"
    with capture.Recorder(model, path, name="toy"):
        model(torch.ones(2, 3))
        model(torch.ones(4, 3), y=torch.ones(4, 3))
        model(torch.ones(5, 3))
    return str(path)


def _run(store: str, *args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", store, "query", *args], input=input)
    return result.exit_code, result.stdout, result.stderr


QUERY_OUTPUT = {
    "table": (
        "path         kind     shape\n"
        "-----------  -------  ------\n"
        "args[0]      tensor   [2, 3]\n"
        "kwargs['y']  missing  null\n"
        "args[0]      tensor   [4, 3]\n"
        "kwargs['y']  tensor   [4, 3]\n"
        "args[0]      tensor   [5, 3]\n"
        "kwargs['y']  missing  null\n"
    ),
    "json": (
        "[\n"
        '  {"path": "args[0]", "kind": "tensor", "shape": [2, 3]},\n'
        '  {"path": "kwargs[\'y\']", "kind": "missing", "shape": null},\n'
        '  {"path": "args[0]", "kind": "tensor", "shape": [4, 3]},\n'
        '  {"path": "kwargs[\'y\']", "kind": "tensor", "shape": [4, 3]},\n'
        '  {"path": "args[0]", "kind": "tensor", "shape": [5, 3]},\n'
        '  {"path": "kwargs[\'y\']", "kind": "missing", "shape": null}\n'
        "]\n"
    ),
    "jsonl": (
        '{"path": "args[0]", "kind": "tensor", "shape": [2, 3]}\n'
        '{"path": "kwargs[\'y\']", "kind": "missing", "shape": null}\n'
        '{"path": "args[0]", "kind": "tensor", "shape": [4, 3]}\n'
        '{"path": "kwargs[\'y\']", "kind": "tensor", "shape": [4, 3]}\n'
        '{"path": "args[0]", "kind": "tensor", "shape": [5, 3]}\n'
        '{"path": "kwargs[\'y\']", "kind": "missing", "shape": null}\n'
    ),
    "csv": (
        "path,kind,shape\n"
        'args[0],tensor,"[2, 3]"\n'
        "kwargs['y'],missing,\n"
        'args[0],tensor,"[4, 3]"\n'
        "kwargs['y'],tensor,\"[4, 3]\"\n"
        'args[0],tensor,"[5, 3]"\n'
        "kwargs['y'],missing,\n"
    ),
}


@pytest.mark.parametrize("fmt", sorted(QUERY_OUTPUT))
def test_query_prints_each_format(store: str, fmt: str) -> None:
    code, out, err = _run(store, INPUT_LEAVES, "-f", fmt)
    assert code == 0
    assert out == QUERY_OUTPUT[fmt]
    assert err == ""


def test_query_table_is_the_default_format(store: str) -> None:
    code, out, err = _run(store, INPUT_LEAVES)
    assert code == 0
    assert out == QUERY_OUTPUT["table"]
    assert err == ""


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [("table", "toy  3\n"), ("csv", "toy,3\n")],
)
def test_query_no_headers(store: str, fmt: str, expected: str) -> None:
    sql = "SELECT model, count(*) AS calls FROM calls GROUP BY model"
    code, out, err = _run(store, sql, "-f", fmt, "--no-headers")
    assert code == 0
    assert out == expected
    assert err == ""


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_query_empty_result(store: str, fmt: str) -> None:
    code, out, err = _run(store, "SELECT * FROM calls WHERE false", "-f", fmt)
    assert code == 0
    assert out == ("[]\n" if fmt == "json" else "")
    assert err == ""


def test_query_binds_named_params(store: str) -> None:
    sql = (
        "SELECT path, shape FROM leaves WHERE side = $side AND shape[1] >= $n "
        "ORDER BY call_id, leaf"
    )
    code, out, err = _run(store, sql, "-p", "n", "4", "-p", "side", "input", "-f", "csv")
    assert code == 0
    assert out == 'path,shape\nargs[0],"[4, 3]"\nkwargs[\'y\'],"[4, 3]"\nargs[0],"[5, 3]"\n'
    assert err == ""


def test_query_param_values_are_int_then_float_then_string(store: str) -> None:
    sql = "SELECT typeof($i) AS i, typeof($f) AS f, typeof($s) AS s"
    code, out, err = _run(
        store, sql, "-p", "i", "8", "-p", "f", "0.5", "-p", "s", "8x", "-f", "csv"
    )
    assert code == 0
    assert out == "i,f,s\nINTEGER,DOUBLE,VARCHAR\n"
    assert err == ""


def test_query_params_are_never_formatted_into_the_sql(store: str) -> None:
    code, out, err = _run(store, "SELECT $s AS s", "-p", "s", "x' OR 1=1 --", "-f", "jsonl")
    assert code == 0
    assert out == '{"s": "x\' OR 1=1 --"}\n'
    assert err == ""


def test_query_reads_sql_from_stdin(store: str) -> None:
    code, out, err = _run(store, "-", "-f", "csv", input="SELECT count(*) AS n FROM calls\n")
    assert code == 0
    assert out == "n\n3\n"
    assert err == ""


def test_query_store_from_environment(store: str) -> None:
    runner = CliRunner(env={"CAPTURE_STORE": store})
    result = runner.invoke(cli, ["query", "SELECT count(*) AS n FROM calls", "-f", "csv"])
    assert result.exit_code == 0
    assert result.stdout == "n\n3\n"
    assert result.stderr == ""


def test_query_default_store_is_capture_store_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = Toy()
    with capture.Recorder(model, tmp_path / "capture-store", name="toy"):
        model(torch.ones(2, 3))
    monkeypatch.chdir(tmp_path)
    runner = CliRunner(env={"CAPTURE_STORE": None})
    result = runner.invoke(cli, ["query", "SELECT count(*) AS n FROM calls", "-f", "csv"])
    assert result.exit_code == 0
    assert result.stdout == "n\n1\n"
    assert result.stderr == ""


def test_query_bad_sql_is_one_line_exit_1(store: str) -> None:
    code, out, err = _run(store, "SELEC 1")
    assert code == 1
    assert out == ""
    assert err == (
        'Error: query failed: Parser Error: syntax error at or near "SELEC" (LINE 1: SELEC 1)\n'
    )


def test_query_unknown_column_is_one_line_exit_1(store: str) -> None:
    code, out, err = _run(store, "SELECT nope FROM calls")
    assert code == 1
    assert out == ""
    assert err.startswith('Error: query failed: Binder Error: Referenced column "nope" not found')
    assert err.count("\n") == 1


def test_query_missing_param_is_exit_1(store: str) -> None:
    code, out, err = _run(store, "SELECT $n AS n")
    assert code == 1
    assert out == ""
    assert err == (
        "Error: query failed: Invalid Input Error: "
        "Values were not provided for the following parameters: n\n"
    )


def test_query_missing_store_is_exit_1(tmp_path: Path) -> None:
    missing = str(tmp_path / "missing")
    code, out, err = _run(missing, "SELECT 1")
    assert code == 1
    assert out == ""
    assert err == (
        f"Error: no store at {missing}; record into it first (capture.Recorder) "
        "or pass --store / set CAPTURE_STORE\n"
    )


def test_query_empty_store_directory_is_exit_1(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = _run(str(empty), "SELECT 1")
    assert code == 1
    assert out == ""
    assert err == (
        f"Error: the store at {empty} holds no recorded call yet; record into it first "
        "(capture.Recorder) or pass another --store\n"
    )


def test_query_skips_truncated_file_with_one_warning(store: str) -> None:
    (good,) = [p for p in Path(store, "calls").rglob("*.parquet")]
    broken = good.with_name("broken.parquet")
    broken.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    code, out, err = _run(store, "SELECT count(*) AS n FROM calls", "-f", "csv")
    assert code == 0
    assert out == "n\n3\n"
    assert err.startswith(f"warning: capture: skipping unreadable store file {broken} (")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Error: Missing argument 'SQL'."),
        (["  "], "Error: Invalid value for 'SQL': the SQL is empty"),
        (
            ["SELECT 1", "-f", "xml"],
            "Error: Invalid value for '-f' / '--format': 'xml' is not one of",
        ),
        (["SELECT $n", "-p", "n"], "Error: Option '-p' requires 2 arguments."),
        (
            ["SELECT 1", "-p", "$n", "1"],
            "Error: Invalid value for '-p' / '--param': '$n' is not a parameter name; use a "
            "plain identifier, e.g. -p n 8 for $n",
        ),
        (
            ["SELECT $n", "-p", "n", "1", "-p", "n", "2"],
            "Error: Invalid value for '-p' / '--param': $n is given twice; pass each parameter "
            "once",
        ),
    ],
)
def test_query_usage_errors_exit_2(store: str, args: list[str], message: str) -> None:
    code, out, err = _run(store, *args)
    assert code == 2
    assert out == ""
    assert message in err
    assert "Traceback" not in err


def test_query_store_path_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    _run(str(missing), "SELECT 1")
    assert not os.path.exists(missing)


# -- summary -----------------------------------------------------------------------------------
def _invoke(store: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", store, *args])
    return result.exit_code, result.stdout, result.stderr


def test_summary_table_is_a_report(store: str) -> None:
    with capture.open_store(store) as opened:
        data = opened.summary()
    assert data.first_ts is not None and data.last_ts is not None
    first = dt.datetime.fromisoformat(data.first_ts).astimezone(dt.timezone.utc)
    last = dt.datetime.fromisoformat(data.last_ts).astimezone(dt.timezone.utc)
    # to the second, the day once (json keeps the microseconds).
    day = "" if last.date() == first.date() else f"{last:%Y-%m-%d} "
    span = f"from {first:%Y-%m-%d %H:%M:%S} to {day}{last:%H:%M:%S} UTC"
    code, out, err = _invoke(store, "summary")
    assert code == 0
    assert out == (
        f"Store {store}\n"
        f"3 calls (0 raised), 3 distinct signatures, {span}\n"
        "\n"
        "== Model toy ==\n"
        f"3 calls (0 raised), 3 distinct signatures, {span}\n"
        "\n"
        "Call groups (calls sharing one input structure), largest first\n"
        "  group  calls  share  signatures  raised  inputs  absent\n"
        "  -----  -----  -----  ----------  ------  ------  ------\n"
        "  g0         2  66.7%           2       0  x       y\n"
        "  g1         1  33.3%           1       0  x, y\n"
        "\n"
        "Dynamic dims (dims sharing a symbol are equal in every call)\n"
        "  group  symbol  min  max  distinct  dims\n"
        "  -----  ------  ---  ---  --------  ----------------\n"
        "  g0     x_0       2    5         2  args[0].shape[0]\n"
        "\n"
        "Optional inputs (passed in some calls only; counts are calls)\n"
        "  argument  present  missing  none  absent in\n"
        "  --------  -------  -------  ----  ---------\n"
        "  y               1        2     0  g0\n"
    )
    assert err == ""


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_summary_json_is_the_library_summary(store: str, fmt: str) -> None:
    with capture.open_store(store) as opened:
        data = opened.summary()
    code, out, err = _invoke(store, "summary", "-f", fmt)
    assert code == 0
    assert out == json.dumps(data.to_json(), indent=2 if fmt == "json" else None) + "\n"
    assert err == ""


def test_summary_model_filter(store: str) -> None:
    code, out, err = _invoke(store, "summary", "--model", "toy", "-f", "json")
    assert code == 0
    (entry,) = json.loads(out)["models"]
    assert entry["model"] == "toy"
    # `ModelSummary.model_name` keeps the store's column name in the JSON form, first as ever
    assert list(entry)[:3] == ["model", "calls", "errors"] and "model_name" not in entry
    assert err == ""


@pytest.mark.parametrize("command", ["summary", "dims"])
def test_unknown_model_is_exit_1(store: str, command: str) -> None:
    code, out, err = _invoke(store, command, "--model", "nope")
    assert code == 1
    assert out == ""
    assert err == (
        f"Error: no model 'nope' in the store at {store} (models: toy); "
        "pass --model with one of them\n"
    )


def test_summary_rejects_csv(store: str) -> None:
    code, out, err = _invoke(store, "summary", "-f", "csv")
    assert code == 2
    assert out == ""
    assert "Error: Invalid value for '-f' / '--format': 'csv' is not one of" in err


# -- dims --------------------------------------------------------------------------------------
def _structure_ids(store: str) -> tuple[str, str]:
    """(the 2-call structure, the 1-call structure): ids are content hashes, not pinned here."""
    with capture.open_store(store) as opened:
        rows = opened.query(
            "SELECT in_structure FROM calls GROUP BY in_structure ORDER BY count(*) DESC"
        ).column("in_structure")
    first, second = rows.to_pylist()
    return str(first), str(second)


def test_dims_csv(store: str) -> None:
    g0, g1 = _structure_ids(store)
    code, out, err = _invoke(store, "dims", "-f", "csv")
    assert code == 0
    assert out == (
        "model,group,structure_id,leaf,path,argument,axis,dynamic,min,max,distinct,calls,"
        "symbol,expr\n"
        f"toy,g0,{g0},0,args[0],x,0,true,2,5,2,2,x_0,\n"
        f"toy,g0,{g0},0,args[0],x,1,false,3,3,1,2,,\n"
        f"toy,g1,{g1},0,args[0],x,0,false,4,4,1,1,,\n"
        f"toy,g1,{g1},0,args[0],x,1,false,3,3,1,1,,\n"
        f"toy,g1,{g1},1,kwargs['y'],y,0,false,4,4,1,1,,\n"
        f"toy,g1,{g1},1,kwargs['y'],y,1,false,3,3,1,1,,\n"
    )
    assert err == ""


def test_dims_table_no_headers(store: str) -> None:
    g0, g1 = _structure_ids(store)
    code, out, err = _invoke(store, "dims", "--model", "toy", "--no-headers")
    assert code == 0
    assert out == (
        f"toy  g0  {g0}  0  args[0]      x  0  true   2  5  2  2  x_0   null\n"
        f"toy  g0  {g0}  0  args[0]      x  1  false  3  3  1  2  null  null\n"
        f"toy  g1  {g1}  0  args[0]      x  0  false  4  4  1  1  null  null\n"
        f"toy  g1  {g1}  0  args[0]      x  1  false  3  3  1  1  null  null\n"
        f"toy  g1  {g1}  1  kwargs['y']  y  0  false  4  4  1  1  null  null\n"
        f"toy  g1  {g1}  1  kwargs['y']  y  1  false  3  3  1  1  null  null\n"
    )
    assert err == ""


def test_dims_jsonl_first_row(store: str) -> None:
    g0, _ = _structure_ids(store)
    code, out, err = _invoke(store, "dims", "-f", "jsonl")
    assert code == 0
    assert out.splitlines()[0] == (
        f'{{"model": "toy", "group": "g0", "structure_id": "{g0}", "leaf": 0, "path": "args[0]", '
        '"argument": "x", "axis": 0, "dynamic": true, "min": 2, "max": 5, "distinct": 2, '
        '"calls": 2, "symbol": "x_0", "expr": null}'
    )
    assert err == ""


def test_dims_with_truncated_structures_file_warns_per_problem(store: str) -> None:
    g0, g1 = _structure_ids(store)
    (structures,) = Path(store, "structures").rglob("*.parquet")
    structures.write_bytes(structures.read_bytes()[:300])
    code, out, err = _invoke(store, "dims", "-f", "csv", "--no-headers")
    assert code == 0
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"warning: capture: skipping unreadable store file {structures} (")
    assert lines[1] == (
        f"warning: capture: 2 calls of model toy use structure {g0}, which no readable "
        "structures file describes; they are left out of the analysis"
    )
    assert lines[2] == (
        f"warning: capture: 1 calls of model toy use structure {g1}, which no readable "
        "structures file describes; they are left out of the analysis"
    )


@pytest.mark.parametrize("extra", [["-f", "json"], ["-f", "table"], ["--no-headers"]])
def test_dims_python_conflicts_with_table_options(store: str, extra: list[str]) -> None:
    code, out, err = _invoke(store, "dims", "--python", *extra)
    assert code == 2
    assert out == ""
    assert err == (
        "Error: --python prints Python source; it takes neither -f/--format nor --no-headers "
        "(see 'capture dims --help')\n"
    )


def test_dims_python_prints_the_library_source(store: str) -> None:
    from replay.inputs.source import dynamic_shapes_source

    with capture.open_store(store) as opened:
        expected = dynamic_shapes_source(opened, model_name="toy")
    code, out, err = _invoke(store, "dims", "--model", "toy", "--python")
    assert code == 0
    assert out == expected.rstrip("\n") + "\n"
    assert err == ""


def test_dims_python_output_is_valid_python(store: str) -> None:
    code, out, err = _invoke(store, "dims", "--python")
    assert code == 0
    compile(out, "<capture dims --python>", "exec")
    assert err == ""


def test_dims_python_unknown_model_is_exit_1(store: str) -> None:
    code, out, err = _invoke(store, "dims", "--python", "--model", "nope")
    assert code == 1
    assert out == ""
    assert err.startswith("Error: no model 'nope' in the store at ")
