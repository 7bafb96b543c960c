"""Crafted stores: a store is data; nothing in it runs code, hides calls or deletes
what it should not, and every command answers or fails with one line.

Each test copies a real recorded store (6 calls of a tiny model, one calls file per call), plants
one hostile thing in it, and checks that nothing outside the store is read, written, imported or
executed (a marker file and `sys.modules`), that no real call is hidden or deleted, and what each
command prints.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from planted import planted_module

import replay
from capture import schema
from capture.cli.main import cli
from capture.errors import ReplayError
from capture.pytree.recorded_structure import RecordedStructure
from capture.record.recorder import Recorder

CALLS = 6
EVIL = "hostile_evil_mod"  # a module planted in the working directory by the tests


class Add(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x + y


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real store: 6 calls of `Add` under model 'add', each flushed into its own files."""
    root = tmp_path_factory.mktemp("hostile") / "store"
    rec = Recorder(Add(), root, name="add", flush_seconds=3600)
    with rec, torch.no_grad():
        for n in range(1, CALLS + 1):
            rec.model(torch.ones(n, 3), torch.ones(n, 3))
            rec.flush()
    return root


@pytest.fixture
def store(template: Path, tmp_path: Path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(template, root, symlinks=True)
    return root


@pytest.fixture
def evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A module in the cwd (and on sys.path) that writes a marker file when imported."""
    # nothing from the store imported (planted_module checks it on exit)
    with planted_module(tmp_path, monkeypatch, EVIL, "class Thing:\n    pass\n") as marker:
        yield marker
        assert not marker.exists()  # nothing from the store ran


def _run(store: Path | str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", str(store), *args])
    return result.exit_code, result.stdout, result.stderr


def _count(store: Path) -> tuple[int, str]:
    code, out, err = _run(store, "query", "SELECT count(*) AS n FROM calls", "-f", "csv")
    assert code == 0, err
    return int(out.splitlines()[1]), err


def _ids(store: Path) -> list[int]:
    code, out, err = _run(store, "query", "SELECT call_id FROM calls ORDER BY 1", "-f", "json")
    assert code == 0, err
    return [row["call_id"] for row in json.loads(out)]


def _files(store: Path, table: str = schema.CALLS) -> list[Path]:
    return sorted(p for p in (store / table).rglob("*.parquet") if not p.is_symlink())


def _rewrite(path: Path, change: Callable[[pa.Table], pa.Table], **extra: bytes) -> None:
    """Rewrites a store file with `change` applied, keeping (and adding to) its metadata."""
    table = pq.read_table(path)
    meta = dict(table.schema.metadata or {})
    meta.update({k.replace("_", ".", 1).encode(): v for k, v in extra.items()})
    new = change(table)
    pq.write_table(new.replace_schema_metadata(meta), path)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, err
    return lines[0]


def _set_treespec(store: Path, treespec: str) -> None:
    for path in _files(store, schema.STRUCTURES):
        _rewrite(
            path,
            lambda t: t.set_column(
                t.schema.get_field_index("treespec"),
                t.schema.field("treespec"),
                pa.array([treespec] * t.num_rows, pa.string()),
            ),
        )


def _treespec(store: Path) -> str:
    table = pq.read_table(_files(store, schema.STRUCTURES)[0])
    return str(table.column("treespec")[0].as_py())


_LEAF = {"type": None, "context": None, "children_spec": []}


def _with_kwargs(store: Path, node: dict[str, object]) -> str:
    """The recorded treespec with its (empty) kwargs dict replaced by `node`."""
    protocol, root = json.loads(_treespec(store))
    root["children_spec"][1] = node
    return json.dumps([protocol, root])


# -- 1. treespecs never import, evaluate or unpickle ------------------------------------------
@pytest.mark.parametrize(
    "node",
    [
        {  # torch's treespec_loads imports default_factory_module
            "type": "collections.defaultdict",
            "context": {
                "default_factory_module": EVIL,
                "default_factory_name": "f",
                "dict_context": [],
            },
            "children_spec": [],
        },
        # torch's loader turns {"__enum__": ...} context keys into an import
        {
            "type": "builtins.dict",
            "context": json.dumps([{"__enum__": True, "fqn": f"{EVIL}:Thing", "name": "A"}]),
            "children_spec": [_LEAF],
        },
        {"type": f"{EVIL}.Thing", "context": "null", "children_spec": []},
        {"type": "collections.namedtuple", "context": f"{EVIL}.Thing", "children_spec": [_LEAF]},
    ],
    ids=["defaultdict-module", "enum-context", "class-node", "namedtuple-name"],
)
def test_treespec_naming_a_module_imports_nothing(
    store: Path, evil_module: Path, node: dict[str, object]
) -> None:
    _set_treespec(store, _with_kwargs(store, node))
    with pytest.raises(ReplayError) as info:
        replay.export_inputs(str(store), "add").group("g0").args  # noqa: B018
    assert "\n" not in str(info.value)  # one line
    code, out, err = _run(store, "dims", "--python")
    assert (code, out) == (1, "")
    assert _one_line(err)


def test_payload_check_reads_treespecs_with_the_allow_list(
    tmp_path: Path, evil_module: Path
) -> None:
    import pyarrow.fs as pafs

    from capture.store.payload_files import list_payloads, read_payload
    from replay.check.payload_rows import real_call

    model = torch.nn.Linear(4, 2)
    with Recorder(model, tmp_path / "p", flush_seconds=3600, payloads=1.0):
        model(torch.ones(2, 4))
    (info,) = list_payloads(tmp_path / "p")
    payload = read_payload(pafs.LocalFileSystem(), info.path)
    leaves = pq.read_table(_files(tmp_path / "p", schema.STRUCTURES)[0]).to_pylist()
    leaves = [r for r in leaves if r["structure_id"] == payload.in_structure]
    protocol, root = json.loads(leaves[0]["treespec"])
    root["children_spec"][1] = {  # torch's treespec_loads would import the planted module
        "type": "collections.defaultdict",
        "context": {
            "default_factory_module": EVIL,
            "default_factory_name": "f",
            "dict_context": [],
        },
        "children_spec": [],
    }
    leaves[0]["treespec"] = json.dumps([protocol, root])
    with pytest.raises(ReplayError):  # the evil_module fixture checks nothing ran
        real_call(RecordedStructure.from_rows(leaves), payload)


def test_treespec_class_outside_the_allow_list_is_an_error_naming_its_source(
    store: Path, evil_module: Path
) -> None:
    _set_treespec(
        store,
        _with_kwargs(store, {"type": f"{EVIL}.Thing", "context": "null", "children_spec": []}),
    )
    with pytest.raises(ReplayError, match=f"names the node type '{EVIL}.Thing'"):
        replay.export_inputs(str(store), "add").group("g0").args  # noqa: B018


def test_treespec_of_another_protocol_is_refused(store: Path) -> None:
    protocol, root = json.loads(_treespec(store))
    _set_treespec(store, json.dumps([protocol + 1, root]))
    with pytest.raises(ReplayError, match="uses protocol 2"):
        replay.export_inputs(str(store), "add").group("g0").args  # noqa: B018


def test_allowed_namedtuple_is_rebuilt_without_importing(store: Path, evil_module: Path) -> None:
    from capture.pytree import treespec

    node = treespec.parse(
        json.dumps(
            [
                1,
                {
                    "type": "collections.namedtuple",
                    "context": f"{EVIL}.Point",
                    "children_spec": [_LEAF, _LEAF],
                },
            ]
        )
    )
    spec = treespec.to_treespec(node)
    value = torch.utils._pytree.tree_unflatten([1, 2], spec)
    assert (type(value).__name__, tuple(value)) == ("Point", (1, 2))


# -- 2. planted replaces, self-replacing files ------------------------------------------------
def _planted_replaces(store: Path, names: list[str], **extra: bytes) -> Path:
    """An empty, well-formed calls file (copied metadata) listing `names` as replaced."""
    folder = _files(store)[0].parent
    planted = folder / "compact-planted.parquet"
    shutil.copy(_files(store)[0], planted)
    _rewrite(planted, lambda t: t.slice(0, 0), capture_replaces=json.dumps(names).encode(), **extra)
    return planted


def test_planted_replaces_hides_no_call(store: Path) -> None:
    _planted_replaces(store, [p.name for p in _files(store)])
    count, err = _count(store)
    assert count == CALLS  # an empty file cannot hide the 6 real calls
    assert "does not hold its rows" in err


def test_planted_replaces_with_matching_row_counts_hides_no_call(store: Path) -> None:
    real = _files(store)
    folder = real[0].parent
    planted = folder / "compact-forged.parquet"
    shutil.copy(real[0], planted)
    # as many rows as each listed file, and their count in the claim, but other call ids
    _rewrite(
        planted,
        lambda t: t.set_column(0, t.schema.field(0), pa.array([10_000], pa.int64())),
        capture_replaces=json.dumps([real[1].name]).encode(),
        capture_replaces_rows=json.dumps({real[1].name: 1}).encode(),
    )
    assert _ids(store).count(10_000) == 1
    assert len(_ids(store)) == CALLS + 1  # real[1]'s call stays visible


def test_compact_deletes_no_file_a_planted_claim_lists(store: Path) -> None:
    real = _files(store)
    _planted_replaces(store, [p.name for p in real])
    code, out, err = _run(store, "compact")
    assert code == 0, err
    assert "nothing deleted for:" in out
    assert _count(store)[0] == CALLS  # compact merges them, never deletes them


def test_self_replacing_file_is_read_and_kept(store: Path) -> None:
    target = _files(store)[0]
    _rewrite(target, lambda t: t, capture_replaces=json.dumps([target.name]).encode())
    assert _count(store)[0] == CALLS
    code, _, err = _run(store, "compact")
    assert code == 0, err
    assert _count(store)[0] == CALLS  # not deleted as its own leftover


def test_genuine_leftovers_are_hidden_then_deleted(store: Path, tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    shutil.copytree(store / "calls", backup)
    assert _run(store, "compact")[0] == 0
    shutil.copytree(backup, store / "calls", dirs_exist_ok=True)  # as if compact died
    assert _count(store)[0] == CALLS  # the merged file provably holds them: no double count
    code, out, err = _run(store, "compact")
    assert (code, err) == (0, "")
    assert "deleted 6 file(s) an earlier compaction had already replaced" in out
    assert len(_files(store)) == 1


# -- 2. symbolic links ------------------------------------------------------------------------
def test_link_to_another_store_is_not_read_nor_compacted(
    store: Path, template: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(template, other)
    before = sorted(p.name for p in _files(other))
    (store / "calls" / "model=other").symlink_to(other / "calls" / "model=add")
    count, err = _count(store)
    assert count == CALLS
    assert "symbolic link" in err
    assert _run(store, "compact")[0] == 0
    assert sorted(p.name for p in _files(other)) == before  # nothing merged there


def test_link_loop_counts_each_call_once(store: Path) -> None:
    folder = _files(store)[0].parent
    (folder / "loop").symlink_to(folder)
    (store / "calls" / "up").symlink_to(store)
    assert _count(store)[0] == CALLS  # each call once, however the links loop


def test_linked_file_outside_the_store_is_skipped(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.parquet"
    shutil.copy(_files(store)[0], outside)
    (_files(store)[0].parent / "linked.parquet").symlink_to(outside)
    count, err = _count(store)
    assert count == CALLS
    assert "linked.parquet" in err
    _run(store, "compact")
    assert outside.exists()  # not deleted through the link


# -- 3. foreign, wrong-schema, truncated, bomb files -----------------------------------------
def test_foreign_parquet_in_calls_is_skipped(store: Path) -> None:
    pq.write_table(pa.table({"call_id": [1, 2]}), store / "calls" / "foreign.parquet")
    count, err = _count(store)
    assert count == CALLS  # its rows are not counted as calls
    assert "foreign.parquet (not a capture file" in err


def test_wrong_schema_calls_file_is_skipped(store: Path) -> None:
    path = _files(store)[0].parent / "wrong.parquet"
    shutil.copy(_files(store)[0], path)
    _rewrite(path, lambda t: t.drop_columns(["call_id"]).append_column("x", pa.array([1])))
    count, err = _count(store)
    assert count == CALLS
    assert "it has no column 'call_id'" in err


@pytest.mark.parametrize("command", [["summary"], ["dims"], ["compact"], ["query", "SELECT 1"]])
def test_wrong_schema_stats_file_breaks_no_command(store: Path, command: list[str]) -> None:
    path = _files(store, schema.STATS)[0].parent / "wrong.parquet"
    shutil.copy(_files(store, schema.STATS)[0], path)
    _rewrite(
        path,
        lambda t: t.set_column(
            t.schema.get_field_index("calls"), "calls", pa.array(["x"] * t.num_rows)
        ),
    )
    code, out, err = _run(store, *command)
    assert code == 0  # the file is skipped, the command answers
    if command == ["compact"]:
        assert f"left alone (unreadable): {path}" in out
    else:
        assert "column 'calls' is string, expected int64" in err


def test_truncated_file_is_skipped(store: Path) -> None:
    path = _files(store)[0]
    path.write_bytes(path.read_bytes()[:40])
    count, err = _count(store)
    assert count == CALLS - 1
    assert err.count("warning: capture: skipping") == 1


def test_bomb_file_is_skipped_by_readers_and_compaction(store: Path) -> None:
    path = _files(store)[0].parent / "bomb.parquet"
    rows = pq.read_table(_files(store)[0])
    huge = pa.array([[0] * 10_000_000], pa.list_(pa.int64()))  # 80 MB of zeros, a few KB zstd
    bomb = rows.set_column(rows.schema.get_field_index("dims"), rows.schema.field("dims"), huge)
    pq.write_table(bomb, path, compression="zstd")
    assert path.stat().st_size < 100_000
    count, err = _count(store)
    assert count == CALLS
    assert "bomb.parquet (declares" in err
    code, _, err = _run(store, "compact")
    assert code == 0, err  # compaction skips it too


def test_newer_schema_file_is_skipped_with_one_warning(store: Path) -> None:
    path = _files(store)[0]
    _rewrite(path, lambda t: t, capture_schema_version=b"99")
    code, out, err = _run(store, "query", "SELECT count(*) AS n FROM calls", "-f", "csv")
    # a planted "newer" file does not make the store unreadable; it is named, once
    assert code == 0 and out.startswith("n\n")
    assert err.count("written with store schema v99") == 1
    assert "upgrade capture to read it" in err


# -- 3. sizes replay cannot allocate ---------------------------------------------------------
def test_huge_recorded_sizes_are_refused_in_one_line(store: Path) -> None:
    for path in _files(store):
        _rewrite(
            path,
            lambda t: t.set_column(
                t.schema.get_field_index("dims"),
                t.schema.field("dims"),
                pa.array([[100_000, 100_000, 100_000, 100_000]] * t.num_rows, pa.list_(pa.int64())),
            ),
        )
    for path in _files(store, schema.STATS):
        _rewrite(
            path,
            lambda t: t.set_column(
                t.schema.get_field_index("dims"),
                t.schema.field("dims"),
                pa.array([[100_000, 100_000, 100_000, 100_000]] * t.num_rows, pa.list_(pa.int64())),
            ),
        )
    with pytest.raises(ReplayError, match="over replay's limit") as info:
        inputs = replay.export_inputs(str(store), "add")
        for group in inputs.groups:
            group.args  # noqa: B018
    assert "\n" not in str(info.value)


# -- names with quotes, newlines, ../, 300 characters ----------------------------------------
@pytest.mark.parametrize(
    "name",
    [
        'it\'s "quoted"',
        "x\nopen('MARKER_NAME', 'w').write('ran')  # ",
        "../../escape",
        "m" * 200,
    ],
    ids=["quotes", "newline", "dotdot", "200-chars"],
)
def test_odd_model_names_print_safe_python(tmp_path: Path, name: str) -> None:
    root = tmp_path / "store"
    rec = Recorder(Add(), root, name=name, flush_seconds=3600)
    with rec, torch.no_grad():
        for n in (1, 2, 3):
            rec.model(torch.ones(n, 3), torch.ones(n, 3))
    assert not (tmp_path / "escape").exists()
    code, out, err = _run(root, "dims", "--python")
    assert code == 0, err
    marker = tmp_path / "MARKER_NAME"
    namespace: dict[str, object] = {}
    exec(compile(out.replace("MARKER_NAME", str(marker)), "dims.py", "exec"), namespace)  # noqa: S102
    assert not marker.exists()  # a name never leaves its comment
    code, out, err = _run(root, "query", "SELECT DISTINCT model FROM calls", "-f", "json")
    assert json.loads(out) == [{"model": name}]


# -- 4. query reads the store's views and nothing else ---------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('{outside}')",
        "SELECT * FROM glob('{dir}/*')",
        "COPY (SELECT 1) TO '{dir}/written.csv'",
        "ATTACH '{dir}/attached.db'",
        "INSTALL httpfs",
        "SET threads = 1",
    ],
    ids=["read_csv", "glob", "copy", "attach", "install", "set"],
)
def test_query_cannot_reach_outside_the_store(store: Path, tmp_path: Path, sql: str) -> None:
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    text = sql.format(outside=outside, dir=tmp_path)
    code, out, err = _run(store, "query", text)
    assert (code, out) == (1, "")
    assert _one_line(err).startswith("Error: query failed:")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret.csv", "store"]


def test_unsafe_sql_reaches_other_files(store: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    code, out, err = _run(
        store, "query", "--unsafe-sql", f"SELECT a FROM read_csv('{outside}')", "-f", "csv"
    )
    assert (code, out) == (0, "a\n1\n")  # named opt-in


# -- 5. CLI items ------------------------------------------------------------------------------
def test_unknown_uri_scheme_is_one_line(tmp_path: Path) -> None:
    code, out, err = _run("foo://x", "summary")
    assert (code, out) == (1, "")
    assert _one_line(err).startswith("Error: cannot open store foo://x:")


def test_s3_without_network_is_one_line_in_bounded_time(tmp_path: Path) -> None:
    import subprocess

    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parents[1]),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "capture.cli",
            "--store",
            "s3://capture-no-such-bucket/x",
            "summary",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Error: cannot reach the store s3://capture-no-such-bucket/x:")
    assert result.stderr.count("\n") == 1


def test_compact_on_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, "compact")
    assert (code, out) == (1, "")  # like every other command
    assert "holds no recorded call yet" in _one_line(err)


def test_store_after_the_command_says_where_it_goes(store: Path) -> None:
    result = CliRunner().invoke(cli, ["summary", "--store", str(store)])
    assert result.exit_code == 2
    assert "put it before the command" in result.stderr


def test_quoted_param_binds_a_digit_string(store: Path) -> None:
    code, out, err = _run(
        store, "query", "SELECT $h AS h, typeof($h) AS t", "-p", "h", "'007'", "-f", "csv"
    )
    assert (code, out) == (0, "h,t\n007,VARCHAR\n")


def test_no_headers_with_json_is_a_usage_error(store: Path) -> None:
    code, out, err = _run(store, "query", "SELECT 1 AS a", "-f", "json", "--no-headers")
    assert (code, out) == (2, "")
    assert "has no header row" in err


def test_ctrl_c_exits_130_with_one_line(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import capture.store_api

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(capture.store_api, "open_store", interrupted)
    code, out, err = _run(store, "summary")
    assert (code, out, err) == (130, "", "Error: interrupted (Ctrl-C)\n")


def test_interrupted_demo_is_replaced_by_the_next(tmp_path: Path) -> None:
    import click

    from capture.cli import demo

    root = tmp_path / "store"
    rec = Recorder(Add(), root, name=demo.DEMO_MODEL, flush_seconds=3600)
    with rec, torch.no_grad():
        rec.model(torch.ones(1, 3), torch.ones(1, 3))
    (root / demo.INCOMPLETE).write_text("")  # left by a Ctrl-C'd demo
    demo._check_store(str(root))  # no refusal
    assert not (root / "calls" / f"model={demo.DEMO_MODEL}").exists()
    rec = Recorder(Add(), root, name=demo.DEMO_MODEL, flush_seconds=3600)
    with rec, torch.no_grad():
        rec.model(torch.ones(1, 3), torch.ones(1, 3))
    with pytest.raises(click.ClickException, match="already holds"):  # a finished demo: kept
        demo._check_store(str(root))


class Flagged(torch.nn.Module):
    def forward(self, x: torch.Tensor, mode: str = "a") -> torch.Tensor:
        return x if mode == "a" else -x


def test_summary_tells_groups_apart_by_scalar(tmp_path: Path) -> None:
    root = tmp_path / "store"
    rec = Recorder(Flagged(), root, name="flagged", flush_seconds=3600)
    with rec, torch.no_grad():
        rec.model(torch.ones(2, 3), mode="a")
        rec.model(torch.ones(2, 3), mode="b")
    code, out, err = _run(root, "summary")
    assert code == 0, err
    rows = [line for line in out.splitlines() if "kwargs['mode']=" in line]
    # the two groups differ by the scalar only, and say so
    assert sorted(r.split("=")[-1].strip() for r in rows) == ['"a"', '"b"']


def test_summary_dims_cells_stay_short() -> None:
    from capture.analysis.summary import GroupSummary, ModelSummary, Summary, SymbolSummary
    from capture.cli.summary_table import summary_report

    dims = tuple(f"past_key_values.layers[{i}].keys[2]" for i in range(40))
    symbol = SymbolSummary("s", None, 1, 9, 3, dims)
    group = GroupSummary(
        "decode", "s0", 1, 0, 1, 1.0, None, None, ("x",), (), (symbol,), (), {}, None
    )
    model = ModelSummary("m", 1, 0, 1, None, None, (group,), (), (), (), ())
    text = summary_report(Summary("s", 1, 0, 1, None, None, (), (model,)))
    line = next(line for line in text.splitlines() if "past_key_values" in line)
    assert len(line) < 140  # not 300 characters of dims
    assert "+" in line and "more" in line


def test_300_character_model_name_in_the_files(store: Path) -> None:
    name = "n" * 299 + "'"
    for table in schema.TABLES:
        for path in _files(store, table):
            _rewrite(
                path,
                lambda t: t.set_column(
                    t.schema.get_field_index("model"),
                    t.schema.field("model"),
                    pa.array([name] * t.num_rows, pa.string()),
                ),
            )
    code, out, err = _run(store, "dims", "--python")
    assert code == 0, err
    compile(out, "dims.py", "exec")  # odd names still give valid Python
    assert repr(name) in out
    code, out, err = _run(store, "summary", "-f", "json")
    assert code == 0, err
    assert json.loads(out)["models"][0]["model"] == name


@pytest.mark.parametrize("name", ["*.parquet", "it's.parquet", "new\nline.parquet"])
def test_odd_file_names_neither_glob_nor_break_sql(store: Path, name: str) -> None:
    real, source = _ids(store), _files(store)[0]
    folder = source.parent
    pq.write_table(pa.table({"call_id": [1]}), folder / "foreign.parquet")
    shutil.copy(source, folder / name)
    _rewrite(
        folder / name,
        lambda t: t.set_column(0, t.schema.field(0), pa.array([99], pa.int64())),
    )
    ids = _ids(store)
    # a '*' name is skipped, not expanded (which would read foreign.parquet and
    # every calls file twice); other odd names are read as one file each
    assert ids == sorted(real + ([] if "*" in name or "\n" in name else [99]))


def _set_column(store: Path, table: str, column: str, value: str) -> None:
    for path in _files(store, table):
        _rewrite(
            path,
            lambda t: t.set_column(
                t.schema.get_field_index(column),
                t.schema.field(column),
                pa.array([value] * t.num_rows, pa.string()),
            ),
        )


def test_malformed_signature_is_one_line(store: Path) -> None:
    _set_column(store, schema.STRUCTURES, "signature", "[1, 2]")
    code, out, err = _run(store, "dims", "--python")
    assert (code, out) == (1, "")  # one error line, no traceback
    assert "signature is malformed" in _one_line(err)
