"""The artifact's typed manifest: parsed and checked once.

A tampered manifest (a null, a string where a list was, Infinity, a number past any size, a
missing field, a program the archive lacks, ...) must be one `ArtifactError` line from
`replay.load` and from `capture check` alike (they read it with the same parser): before,
12 of 33 such cases crashed with KeyError / TypeError / ValueError / OverflowError tracebacks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from artifact_files import entries, record_scaled, write_entries
from click.testing import CliRunner

import replay
from capture.cli.main import cli
from replay.runtime.manifest import Manifest
from replay.runtime.pt2.loading import ArtifactError, read_manifest

MANIFEST = "extra/capture_manifest.json"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return record_scaled(tmp_path_factory.mktemp("manifest"))


def _with_manifest(template: Path, target: Path, text: bytes) -> Path:
    content = entries(template)
    content[MANIFEST] = text
    return write_entries(target, content, sealed=False)  # the files are the same


def _set(path: str, value: Any) -> Callable[[Any], None]:
    """Sets (or, for the value `_DROP`, removes) a field: ``programs.0.axes.0.max``."""

    def edit(data: Any) -> None:
        *parents, last = path.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key: Any = int(last) if isinstance(node, list) else last
        if value is _DROP:
            del node[key]
        else:
            node[key] = value

    return edit


_DROP = object()

# (edit of the manifest's JSON, or its raw text; the message the refusal names)
TAMPERED: dict[str, tuple[Callable[[Any], None] | bytes, str]] = {
    "programs null": (_set("programs", None), ".programs must be a list, not null"),
    "programs a string": (_set("programs", "g0"), ".programs must be a list, not a string"),
    "programs empty": (_set("programs", []), ".programs is empty"),
    "program null": (_set("programs.0", None), "programs[0] must be a JSON object"),
    "group missing": (_set("programs.0.group", _DROP), "programs[0].group is missing"),
    "group a number": (_set("programs.0.group", 5), "group must be a string, not a number"),
    "program escapes": (_set("programs.0.program", "../g0"), "program is not a valid name"),
    "group twice": (_set("programs.1.group", "g0"), "lists the group g0 twice"),
    "program absent": (_set("programs.0.program", "nosuch"), "t.pt2 lacks archive/data/"),
    "leaves a string": (_set("programs.0.leaves", "x"), "leaves must be a list"),
    "leaf empty": (_set("programs.0.leaves.0", {}), "leaves[0].path is missing"),
    "rank negative": (_set("programs.0.leaves.0.rank", -1), "rank = -1 is outside"),
    "leaf kind": (_set("programs.0.leaves.0.kind", "pickle"), "not a recorded leaf kind"),
    "axes a string": (_set("programs.0.axes", "x"), "axes must be a list"),
    "axes empty": (_set("programs.0.axes", []), "has 0 axes for 2 recorded tensor dims"),
    "max too big": (_set("programs.0.axes.0.max", 10**30), "is outside [0, "),
    "max a string": (_set("programs.0.axes.0.max", "7"), "max must be an integer, not a string"),
    "max a float": (_set("programs.0.axes.0.max", 7.5), "max must be an integer, not a number"),
    "max true": (_set("programs.0.axes.0.max", True), "max must be an integer, not a boolean"),
    "min over max": (_set("programs.0.axes.0.min", 99), "has min 99 > max"),
    "dynamic a string": (_set("programs.0.axes.0.dynamic", "yes"), "dynamic must be true or"),
    "symbol a number": (_set("programs.0.axes.0.symbol", 5), "symbol must be a string"),
    "relations a string": (_set("programs.0.relations", "x"), "relations must be a list"),
    "relation terms": (
        _set("programs.0.relations", [{"symbol": "a", "terms": "b", "offset": 0}]),
        "terms must be a list",
    ),
    "rejected dims": (_set("programs.0.rejected", [{"dims": "x", "error": "e"}]), "dims must be"),
    "rejected width": (
        _set("programs.0.rejected", [{"dims": [1], "error": "e"}]),
        "has 1 dims for 2 axes",
    ),
    "form null": (_set("programs.0.form", None), "form must be a JSON object, not null"),
    "positional a number": (_set("programs.0.form.positional", 3), "positional must be a list"),
    "signature not JSON": (_set("programs.0.signature", "{"), "signature is malformed"),
    "n_args negative": (_set("programs.0.n_args", -1), "n_args = -1 is outside"),
    "calls a boolean": (_set("programs.0.calls", True), "calls must be an integer"),
    "treespec a number": (_set("programs.0.treespec", 5), "treespec must be a string"),
    "pytree_types a string": (_set("programs.0.pytree_types", "x"), "pytree_types must be a list"),
    "modules null": (_set("modules", None), ".modules must be a JSON object, not null"),
    "modules without the model": (_set("modules", {}), "lacks the model's own module"),
    "module not listed": (_set("programs.0.module", "encoder"), "serves the module 'encoder'"),
    "coverage a string": (_set("modules..coverage", "x"), "coverage must be a list"),
    "coverage calls": (_set("modules..coverage.0.calls", -1), "calls = -1 is outside"),
    "format missing": (_set("format", _DROP), "manifest format 'None'"),
    "format newer": (_set("format", "capture-artifact/4"), "this capture reads"),
    "format older": (_set("format", "capture-artifact/1"), "written by an older capture"),
    "digests missing": (_set("digests", _DROP), ".digests is missing"),
    "digest not sha256": (_set("digests", {"models/g0.json": "md5:00"}), "not a sha256 digest"),
    "model a number": (_set("model", 7), ".model must be a string, not a number"),
    "a list": (b"[1, 2]", "manifest format 'None'"),
    "Infinity": (b'{"format": "capture-artifact/1", "model": Infinity}', "is not valid JSON"),
    "NaN": (b'{"format": "capture-artifact/1", "model": NaN}', "is not valid JSON"),
    "1e999": (b'{"format": "capture-artifact/1", "model": 1e999}', "overflows a float"),
    "deep nesting": (b"[" * 200_000, "nests deeper than 200 levels"),
    "not UTF-8": (b'{"format": "\xff"}', "is not valid JSON"),
    "truncated": (b'{"format": "capture-', "is not valid JSON"),
}


def _text(template: Path, change: Callable[[Any], None] | bytes) -> bytes:
    if isinstance(change, bytes):
        return change
    data = json.loads(entries(template)[MANIFEST])
    change(data)  # ("modules..coverage" is modules[""].coverage)
    return json.dumps(data).encode()


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_manifest_is_one_error_from_load_and_from_check(
    case: str, template: tuple[Path, Path], tmp_path: Path
) -> None:
    store, original = template
    change, message = TAMPERED[case]
    path = _with_manifest(original, tmp_path / "t.pt2", _text(original, change))
    with pytest.raises(ArtifactError) as caught:
        replay.load(path)
    text = str(caught.value)
    assert message in text
    assert len(text.splitlines()) == 1 and len(text) < 600
    result = CliRunner().invoke(cli, ["--store", str(store), "check", str(path)])
    # capture check reads the manifest with the same parser: the same one line
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"Error: {text}\n")


def test_a_saved_manifest_parses_back_to_what_was_written(template: tuple[Path, Path]) -> None:
    manifest = read_manifest(template[1])
    again = Manifest.parse(manifest.to_json().encode(), "again")
    assert again == manifest
    assert [p.program for p in manifest.programs] == ["g0", "g1"]


def test_the_saved_manifest_names_the_store_model_under_model(
    template: tuple[Path, Path],
) -> None:
    """`model_name` in Python, ``model`` in the JSON: the manifest's keys stay what they were."""
    manifest = read_manifest(template[1])
    raw = json.loads(entries(template[1])[MANIFEST])
    name = manifest.model_name
    assert raw["model"] == name
    assert [m["model"] for m in raw["modules"].values()] == [name]
    assert {p["model"] for p in raw["programs"]} == {name}
    assert "model_name" not in {
        *raw,
        *raw["modules"][""],
        *(k for p in raw["programs"] for k in p),
    }
