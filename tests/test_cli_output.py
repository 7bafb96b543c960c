"""cli/output.py: the single renderer (table, json, jsonl, csv) and its value rules."""

from __future__ import annotations

import datetime as dt
import decimal

import click
import pyarrow as pa
import pytest

from capture.cli.output import (
    FORMATS,
    render,
    render_document,
    table_text,
    to_json_value,
    write_text,
)


def _mixed() -> pa.Table:
    return pa.table(
        {
            "name": ["a", "b\nc", None],
            "n": [1, 22, None],
            "x": [1.5, float("nan"), float("-inf")],
            "shape": [[2, 7], [], None],
            "st": [{"k": 1, "v": "z"}, None, {"k": None, "v": "é"}],
            "raw": [b"\x00\xff", b"", None],
            "ok": [True, False, None],
        }
    )


MIXED = {
    "table": (
        "name     n     x  shape   st                     raw   ok\n"
        "----  ----  ----  ------  ---------------------  ----  -----\n"
        'a        1   1.5  [2, 7]  {"k": 1, "v": "z"}     AP8=  true\n'
        "b\\nc    22   nan  []      null                         false\n"
        'null  null  -inf  null    {"k": null, "v": "é"}  null  null\n'
    ),
    "json": (
        "[\n"
        '  {"name": "a", "n": 1, "x": 1.5, "shape": [2, 7], "st": {"k": 1, "v": "z"}, '
        '"raw": "AP8=", "ok": true},\n'
        '  {"name": "b\\nc", "n": 22, "x": null, "shape": [], "st": null, "raw": "", '
        '"ok": false},\n'
        '  {"name": null, "n": null, "x": null, "shape": null, "st": {"k": null, "v": "é"}, '
        '"raw": null, "ok": null}\n'
        "]\n"
    ),
    "jsonl": (
        '{"name": "a", "n": 1, "x": 1.5, "shape": [2, 7], "st": {"k": 1, "v": "z"}, '
        '"raw": "AP8=", "ok": true}\n'
        '{"name": "b\\nc", "n": 22, "x": null, "shape": [], "st": null, "raw": "", '
        '"ok": false}\n'
        '{"name": null, "n": null, "x": null, "shape": null, "st": {"k": null, "v": "é"}, '
        '"raw": null, "ok": null}\n'
    ),
    "csv": (
        "name,n,x,shape,st,raw,ok\n"
        'a,1,1.5,"[2, 7]","{""k"": 1, ""v"": ""z""}",AP8=,true\n'
        '"b\nc",22,nan,[],,,false\n'
        ',,-inf,,"{""k"": null, ""v"": ""é""}",,\n'
    ),
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_render_mixed_types(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    render(_mixed(), fmt)
    out, err = capsys.readouterr()
    assert out == MIXED[fmt]
    assert err == ""


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("table", "a   1.5\nbb  nan\n"),
        ("csv", "a,1.5\nbb,nan\n"),
    ],
)
def test_render_without_headers(
    fmt: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    render(pa.table({"s": ["a", "bb"], "x": [1.5, float("nan")]}), fmt, headers=False)
    assert capsys.readouterr().out == expected


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_render_without_headers_refuses_json(fmt: str) -> None:
    # --no-headers with json/jsonl is a usage error, not silently ignored
    with pytest.raises(click.UsageError, match="has no header row"):
        render(pa.table({"s": ["a"]}), fmt, headers=False)


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [("table", "a\n-\n"), ("csv", "a\n"), ("json", "[]\n"), ("jsonl", "")],
)
def test_render_empty_result(fmt: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    render(pa.table({"a": pa.array([], pa.int64())}), fmt)
    assert capsys.readouterr().out == expected


@pytest.mark.parametrize(
    ("fmt", "expected"), [("table", ""), ("csv", ""), ("json", "[]\n"), ("jsonl", "")]
)
def test_render_no_columns(fmt: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    render(pa.table({}), fmt)
    assert capsys.readouterr().out == expected


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("table", "b  a  b\n-  -  -\n1  2  3\n"),
        ("csv", "b,a,b\n1,2,3\n"),
        ("jsonl", '{"b": 1, "a": 2, "b": 3}\n'),
    ],
)
def test_render_keeps_select_order_and_duplicate_names(
    fmt: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table = pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])], ["b", "a", "b"])
    render(table, fmt)
    assert capsys.readouterr().out == expected


def test_render_other_arrow_types_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    table = pa.table(
        {
            "m": pa.array([[(1, 2.0)]], pa.map_(pa.int32(), pa.float64())),
            "d": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
            "ts": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5)], pa.timestamp("us", tz="UTC")),
            "day": pa.array([dt.date(2024, 1, 2)]),
            "nested": [[[1.0, float("inf")]]],
        }
    )
    render(table, "jsonl")
    assert capsys.readouterr().out == (
        '{"m": {"1": 2.0}, "d": 1.5, "ts": "2024-01-02T03:04:05+00:00", "day": "2024-01-02", '
        '"nested": [[1.0, null]]}\n'
    )


def test_render_other_arrow_types_in_table(capsys: pytest.CaptureFixture[str]) -> None:
    table = pa.table(
        {
            "m": pa.array([[(1, 2.0)]], pa.map_(pa.int32(), pa.float64())),
            "d": pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
            "day": pa.array([dt.date(2024, 1, 2)]),
        }
    )
    render(table, "table")
    assert capsys.readouterr().out == (
        'm              d  day\n----------  ----  ----------\n{"1": 2.0}  1.50  2024-01-02\n'
    )


def test_render_list_of_dicts_unions_keys_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    render([{"a": 1}, {"b": [1, 2], "a": 22}], "table")
    assert capsys.readouterr().out == " a  b\n--  ------\n 1  null\n22  [1, 2]\n"


def test_render_aligns_wide_characters(capsys: pytest.CaptureFixture[str]) -> None:
    render([{"w": "日本", "n": 1}, {"w": "x", "n": 2}], "table")
    assert capsys.readouterr().out == "w     n\n----  -\n日本  1\nx     2\n"


def test_render_streams_json_across_batches(capsys: pytest.CaptureFixture[str]) -> None:
    render(pa.table({"i": list(range(2500))}), "json")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert (lines[0], lines[1], lines[-2], lines[-1]) == ("[", '  {"i": 0},', '  {"i": 2499}', "]")
    assert len(lines) == 2502


def test_render_rejects_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown output format 'xml'"):
        render([{"a": 1}], "xml")


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("json", '{\n  "models": [\n    "toy"\n  ],\n  "x": null\n}\n'),
        ("jsonl", '{"models": ["toy"], "x": null}\n'),
    ],
)
def test_render_document(fmt: str, expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    render_document({"models": ("toy",), "x": float("nan")}, fmt)
    assert capsys.readouterr().out == expected


def test_write_text_ends_with_one_newline(capsys: pytest.CaptureFixture[str]) -> None:
    write_text("dynamic_shapes = {}\n\n")
    assert capsys.readouterr().out == "dynamic_shapes = {}\n"


def test_table_text_indents_every_line() -> None:
    assert table_text([{"a": 1}], indent="  ") == "  a\n  -\n  1"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (b"\x00\xff", "AP8="),
        (float("nan"), None),
        (float("inf"), None),
        (decimal.Decimal("2"), 2),
        (decimal.Decimal("2.5"), 2.5),
        (dt.timedelta(seconds=90), 90.0),
        (pa.MonthDayNano([1, 2, 3]), {"months": 1, "days": 2, "nanoseconds": 3}),
        ((1, "a"), [1, "a"]),
    ],
)
def test_to_json_value(value: object, expected: object) -> None:
    assert to_json_value(value) == expected
