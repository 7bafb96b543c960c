"""Crafted artifacts: an artifact is data, like a store.

Each test copies a real artifact (a small model with weights, two programs), plants one hostile
thing in it, and checks that `replay.load` and `capture check` refuse it with one
`ArtifactError` line naming what was wrong, that no code ran (a marker file the planted code
would write, and `sys.modules` for a planted module) and that nothing printed a traceback. The
"control" tests show that the same planted things DO run under torch's own loader
(``load_pt2``): the refusals guard against something real.
"""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from artifact_files import entries, record_scaled, reseal, write_entries
from hostile_effects import EFFECT_CASES
from hostile_programs import PROGRAM_CASES, planted, write_raw
from planted import planted_module
from verdicts import both

import replay
from replay.runtime.pt2.loading import ArtifactError

EVIL = "hostile_artifact_mod"  # a module planted in the working directory by the tests


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, artifact): two groups (g0 without a mask, g1 with one), one weight each."""
    return record_scaled(tmp_path_factory.mktemp("hostile_artifact"))


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A marker file planted code would write, and a planted module that writes it on import."""
    # nothing named by the archive imported (planted_module checks it on exit)
    with planted_module(tmp_path, monkeypatch, EVIL) as path:
        yield path


def _tampered(template: Path, target: Path, change: Callable[[dict[str, bytes]], None]) -> Path:
    content = entries(template)
    change(content)
    sealed = content.pop("__sealed__", None) is None
    raw = content.pop("__zip__", None)
    if raw is not None:
        reseal(content)
        return write_raw(target, content, json.loads(raw))
    return write_entries(target, content, sealed=sealed)


def _json(entries: dict[str, bytes], name: str, edit: Callable[[Any], None]) -> None:
    data = json.loads(entries[name])
    edit(data)
    entries[name] = json.dumps(data).encode()


def _code(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')"


class _Evil:
    """Pickles to a call that writes the marker (what a hostile pickle does on load)."""

    def __init__(self, code: str) -> None:
        self.code = code

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (self.code,))


def _torch_pickle(marker: Path) -> bytes:
    buffer = io.BytesIO()
    torch.save(_Evil(_code(marker)), buffer)
    return buffer.getvalue()


def _program(entries: dict[str, bytes]) -> str:
    return next(n for n in entries if n.startswith("models/") and n.endswith("g0.json"))


def _set_first(tree: Any, key: str, value: Any) -> bool:
    """Sets the first `key` found (depth first) in a JSON tree."""
    if isinstance(tree, dict):
        if key in tree:
            tree[key] = value
            return True
        return any(_set_first(v, key, value) for v in tree.values())
    if isinstance(tree, list):
        return any(_set_first(v, key, value) for v in tree)
    return False


def _use_pickle(marker: Path) -> Callable[[dict[str, bytes]], None]:
    def change(e: dict[str, bytes]) -> None:
        # every program's config says use_pickle for the record they share (g0's and g1's)
        for config in (
            "data/weights/g0_weights_config.json",
            "data/weights/g1_weights_config.json",
        ):
            first = next(iter(json.loads(e[config])["config"].values()))["path_name"]
            _json(e, config, lambda d: [m.update(use_pickle=True) for m in d["config"].values()])
        e[f"data/weights/{first}"] = _torch_pickle(marker)

    return change


def _opaque(prefix: str, payload: Callable[[Path], bytes] | None) -> Callable[[Path], Any]:
    def make(marker: Path) -> Callable[[dict[str, bytes]], None]:
        def change(e: dict[str, bytes]) -> None:
            # as torch writes an object constant (use_pickle), or naming it as a raw record
            meta = {"path_name": f"{prefix}0", "is_param": False, "use_pickle": bool(payload)}
            config = "data/constants/g0_constants_config.json"
            _json(e, config, lambda d: d["config"].update({"obj": {**meta, "tensor_meta": None}}))
            if payload is not None:
                e[f"data/constants/{prefix}0"] = payload(marker)

        return change

    return make


def _graph(key: str, value: Callable[[Path], Any]) -> Callable[[Path], Any]:
    def make(marker: Path) -> Callable[[dict[str, bytes]], None]:
        def change(e: dict[str, bytes]) -> None:
            name = _program(e)
            _json(e, name, lambda d: _set_first(d, key, value(marker)) or pytest.fail(key))

        return change

    return make


def _evil_call(marker: Path) -> str:
    """One Python expression (single quotes only) that writes the marker when evaluated."""
    return f"__import__('builtins').open('{marker}', 'w').write('ran')"


def _defaultdict_spec(marker: Path) -> str:
    node = {
        "type": "collections.defaultdict",
        "context": {
            "default_factory_module": EVIL,
            "default_factory_name": "f",
            "dict_context": [],
        },
        "children_spec": [],
    }
    args = {"type": "builtins.tuple", "context": "null", "children_spec": []}
    root = {"type": "builtins.tuple", "context": "null", "children_spec": [args, node]}
    return json.dumps([1, root])


def _extra(name: str, data: Callable[[Path], bytes]) -> Callable[[Path], Any]:
    def make(marker: Path) -> Callable[[dict[str, bytes]], None]:
        def change(e: dict[str, bytes]) -> None:
            e[name] = data(marker)

        return change

    return make


def _manifest_types(marker: Path) -> Callable[[dict[str, bytes]], None]:
    def change(e: dict[str, bytes]) -> None:
        manifest = "extra/capture_manifest.json"
        _json(e, manifest, lambda d: d["programs"][0].update(pytree_types=[f"{EVIL}.Thing"]))

    return change


def _manifest_edit(edit: Callable[[Any], None]) -> Callable[[Path], Any]:
    def make(marker: Path) -> Callable[[dict[str, bytes]], None]:
        return lambda e: _json(e, "extra/capture_manifest.json", edit)

    return make


def _deep_condition(d: Any) -> None:
    condition = {"expr": "-" * 1990 + "d0 > 1", "text": "x"}  # no RecursionError
    d["programs"][0].setdefault("conditions", []).append(condition)


def _view_past_end(marker: Path) -> Callable[[dict[str, bytes]], None]:
    def change(e: dict[str, bytes]) -> None:
        config = "data/weights/g0_weights_config.json"

        def grow(d: Any) -> None:
            meta = next(iter(d["config"].values()))["tensor_meta"]
            meta["sizes"] = [{"as_int": 4096}, {"as_int": 4096}]
            meta["strides"] = [{"as_int": 4096}, {"as_int": 1}]

        _json(e, config, grow)

    return change


HOSTILE: dict[str, tuple[Callable[[Path], Any], str]] = {
    # torch's load_pt2 runs torch.load(weights_only=False) on a use_pickle weight
    "use_pickle weight": (_use_pickle, "is stored with use_pickle=True"),
    # torch's load_pt2 runs pickle.loads on an opaque_obj_* constant
    "opaque object": (
        _opaque("opaque_obj_", lambda m: pickle.dumps(_Evil(_code(m)))),
        "opaque_obj_0 is not a file capture writes",
    ),
    "torchbind object": (
        _opaque("custom_obj_", lambda m: b"PK"),
        "custom_obj_0 is not a file capture writes",
    ),
    "object record named by a config": (
        _opaque("opaque_obj_", None),
        "is stored in 'opaque_obj_0', not a raw tensor record",
    ),
    # torch's deserializer falls back to torch.load(weights_only=False) on sample inputs
    "sample inputs": (_extra("data/sample_inputs/g0.pt", _torch_pickle), "is not empty"),
    # torch's loader reads a legacy data/weights/<model>.pt with torch.load
    "legacy weights file": (_extra("data/weights/g0.pt", _torch_pickle), "is not a file capture"),
    "planted file": (_extra("extra/evil.py", lambda m: b"import os"), "is not a file capture"),
    "AOTInductor files": (
        _extra("data/aotinductor/g0/x.so", lambda m: b"\x7fELF"),
        "is not a file",
    ),
    "unreferenced record": (
        _extra("data/weights/weight_99", lambda m: b"\0" * 64),
        "is not a file",
    ),
    # sympy.sympify evaluates expr_str
    "expr_str": (_graph("expr_str", _evil_call), "symbolic expression"),
    # ExportedProgram.module() exec()s guards_code
    "guards_code": (_graph("guards_code", lambda m: [_evil_call(m)]), "the guard"),
    # torch.fx pastes names and keyword names into the code it generates and runs
    "node name": (_graph("name", lambda m: "x = exec('1') or y"), "the name"),
    "argument names": (_graph("forward_arg_names", lambda m: ["a=exec('1')"]), "the name"),
    # deserialize_operator resolves torch.* attributes, then the graph calls them
    "call target": (
        _graph("target", lambda m: "torch.hub.load"),
        "not an operator an artifact may call",
    ),
    # torch's treespec_loads imports a defaultdict's factory module
    "defaultdict factory": (_graph("in_spec", _defaultdict_spec), "defaultdict factory"),
    "manifest pytree type": (_manifest_types, "names the pytree type"),
    "a condition nested 1990 deep": (_manifest_edit(_deep_condition), "deeper than 200 levels"),
    "a manifest value nested 500 deep": (
        _manifest_edit(lambda d: d["programs"][0].update(extra=json.loads("[" * 500 + "]" * 500))),
        "nests deeper than 200 levels of lists and objects",
    ),
    "view past its record": (_view_past_end, "reaches element"),
    **PROGRAM_CASES,
    **EFFECT_CASES,
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_artifact_is_refused_in_one_line_and_runs_nothing(
    case: str,
    template: tuple[Path, Path],
    tmp_path: Path,
    marker: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # replay.load and capture check: one verdict, one line, no print, no file touched
    store, original = template
    make, message = HOSTILE[case]
    path = _tampered(original, tmp_path / "hostile.pt2", make(marker))
    victims = {p: p.read_bytes() for p in map(Path, planted(marker)) if p.is_file()}
    refused = both(path, store, capfd, planted=planted(marker))
    assert refused is not None and message in refused
    assert not marker.exists()  # no code from the artifact ran
    assert not (marker.parent / "new.bin").exists()
    assert {p: p.read_bytes() for p in victims} == victims


def test_a_namespace_the_caller_allows_passes_the_graph_check(
    template: tuple[Path, Path], tmp_path: Path, marker: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # allowed, the operator reaches torch, which does not know it: the same refusal from both
    store, original = template
    make, _ = HOSTILE["custom operator namespace"]
    path = _tampered(original, tmp_path / "hostile.pt2", make(marker))
    refused = both(path, store, capfd, allow_ops=["evil_ns"])
    assert refused is not None and "torch cannot read this program" in refused


def test_the_weights_are_verified_when_asked(template: tuple[Path, Path], tmp_path: Path) -> None:
    make, message = HOSTILE["weight record swapped, same size"]
    path = _tampered(template[1], tmp_path / "swapped.pt2", make(tmp_path / "m"))
    replay.load(path)  # the graphs and configs are intact: served unless asked
    with pytest.raises(ArtifactError, match=message):
        replay.load(path, verify_weights=True)


@pytest.mark.parametrize("case", ["use_pickle weight", "opaque object", "expr_str", "guards_code"])
def test_control_torchs_own_loader_runs_what_was_planted(
    case: str, template: tuple[Path, Path], tmp_path: Path, marker: Path
) -> None:
    # The refusals above are not of harmless changes: torch 2.13's loader runs them.
    from torch.export.pt2_archive._package import load_pt2

    if case == "opaque object" and tuple(map(int, torch.__version__.split(".")[:2])) < (2, 13):
        pytest.skip(
            "torch < 2.13 reads no opaque objects: the planted one is what newer torch runs"
        )

    make, _ = HOSTILE[case]
    plant = make(marker)

    def change(e: dict[str, bytes]) -> None:
        plant(e)
        # torch builds its guard function only for a program with example inputs; plain
        # tensors load with weights_only=True, so nothing else in this archive runs code
        buffer = io.BytesIO()
        torch.save(((torch.randn(2, 3),), {}), buffer)
        e["data/sample_inputs/g0.pt"] = buffer.getvalue()

    path = _tampered(template[1], tmp_path / "hostile.pt2", change)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = load_pt2(str(path)).exported_programs["g0"]
            program.module()(torch.randn(2, 3))  # guards run when the module is called
        except Exception:  # torch may fail after the planted code ran: the marker tells
            pass
    assert marker.read_text() == "ran"


def _zip(path: Path, entries: list[tuple[str, bytes, int]]) -> Path:
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as z:
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate it is asked for
        for name, data, method in entries:
            z.writestr(zipfile.ZipInfo(name), data, compress_type=method)
    return path


def test_a_manifest_bomb_is_refused_before_it_is_read(
    template: tuple[Path, Path], tmp_path: Path
) -> None:
    import tracemalloc

    content = entries(template[1])
    big = b" " * (96 * 2**20)  # 96 MiB of spaces deflate to ~100 KB
    rows = [(f"m/{n}", d, zipfile.ZIP_STORED) for n, d in content.items() if "manifest" not in n]
    path = _zip(tmp_path / "bomb.pt2", [*rows, ("m/extra/capture_manifest.json", big, 8)])
    del big
    assert path.stat().st_size < 2 * 2**20
    tracemalloc.start()
    with pytest.raises(ArtifactError, match="capture_manifest.json is compressed"):
        replay.load(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 8 * 2**20  # the 96 MiB are never inflated (that takes 1.1 GB RSS)


def test_a_manifest_larger_than_the_cap_is_refused_by_its_declared_size(
    template: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("replay.runtime.pt2.loading.MANIFEST_CAP", 100)
    with pytest.raises(ArtifactError, match=r"declares \d+ bytes, more than the 100"):
        replay.load(template[1])


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["m/a", "m/a"], "is in the archive twice"),
        (["m/../a"], "is not safe"),
        (["m/a", "n/b"], "sit under 2 folders"),
    ],
)
def test_malformed_zip_entries_are_refused(tmp_path: Path, names: list[str], message: str) -> None:
    path = _zip(tmp_path / "x.pt2", [(n, b"x", zipfile.ZIP_STORED) for n in names])
    with pytest.raises(ArtifactError, match=message):
        replay.load(path)


def test_a_file_that_is_not_a_zip_is_one_error(tmp_path: Path) -> None:
    path = tmp_path / "x.pt2"
    path.write_bytes(b"not a zip at all")
    with pytest.raises(ArtifactError, match="is not a PT2 archive"):
        replay.load(path)
