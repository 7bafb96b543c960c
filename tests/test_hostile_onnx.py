"""Hostile ONNX sets: one verdict from ``replay.load`` and ``capture check``, and nothing run.

A real set (a linear model recorded with and without an optional input: two ONNX files and
one shared weights file) is copied, one hostile thing is planted in the copy, and the
manifest's digests are rewritten to describe the changed files, as an attacker would (a digest
identifies a file, it does not sign it), unless the case is the swap itself. Each case goes
through both readers (`verdicts.both`): the same one-line refusal, nothing printed, no file
written, none of the planted paths outside the set opened, each under 60 s, no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from verdicts import both

import capture
import replay
from fixtures.seeds import LinearModel
from replay.runtime.digests import digest_file

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

FEATURES = 256  # a 64 KiB weight: it lives in the shared weights file
NAME = "linear.onnx"


def _export(root: Path, scale: float) -> tuple[Path, Path]:
    torch.manual_seed(0)
    model = LinearModel(FEATURES, 64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    with capture.Recorder(model, root / "store", flush_seconds=3600), torch.no_grad():
        for rows in (2, 3, 5):
            model(x=torch.randn(rows, FEATURES))
        for rows in (2, 4):
            model(x=torch.randn(rows, FEATURES), labels=torch.randint(0, 64, (rows,)))
    target = root / "out" / NAME
    target.parent.mkdir()
    replay.export(model, root / "store", onnx=target)
    return root / "store", target


@pytest.fixture(scope="module")
def sets(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(store, the set, another set of the same model with zeroed weights)."""
    store, target = _export(tmp_path_factory.mktemp("onnx_set"), 1.0)
    _, zeroed = _export(tmp_path_factory.mktemp("onnx_zeroed"), 0.0)
    return store, target.parent, zeroed.parent


def _files(folder: Path) -> list[str]:
    manifest = json.loads((folder / f"{NAME}.json").read_text())
    return sorted({p["file"] for p in manifest["programs"]})


def _reseal(folder: Path) -> None:
    path = folder / f"{NAME}.json"
    manifest = json.loads(path.read_text())
    manifest["digests"] = {
        name: digest_file(str(folder / name))
        for name in manifest["digests"]
        if (folder / name).is_file() and not (folder / name).is_symlink()
    }
    path.write_text(json.dumps(manifest))


def _initializer(folder: Path, edit: Callable[[dict[str, str], Any], None]) -> None:
    """Edits the external-data fields of the first external initializer of the first file."""
    path = folder / _files(folder)[0]
    model = onnx.load(str(path), load_external_data=False)
    init = next(i for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL)
    info = {e.key: e.value for e in init.external_data}
    edit(info, init)
    del init.external_data[:]
    for key, value in info.items():
        init.external_data.add(key=key, value=str(value))
    onnx.save(model, str(path))


def _location(value: str) -> Callable[[Path, Path], None]:
    return lambda folder, _: _initializer(folder, lambda info, _i: info.update(location=value))


def _field(key: str, value: Callable[[dict[str, str]], int]) -> Callable[[Path, Path], None]:
    return lambda folder, _: _initializer(
        folder, lambda info, _i: info.update({key: str(value(info))})
    )


def _drop_length(folder: Path, _: Path) -> None:
    _initializer(folder, lambda info, _i: info.pop("length"))


def _custom_domain(domain: str) -> Callable[[Path, Path], None]:
    def change(folder: Path, _: Path) -> None:
        path = folder / _files(folder)[0]
        model = onnx.load(str(path), load_external_data=False)
        node = model.graph.node[0]
        node.domain = domain
        model.opset_import.add(domain=domain, version=1)
        onnx.save(model, str(path))

    return change


def _outside_tensor() -> onnx.TensorProto:
    """A tensor whose data is declared external, in a file outside the set."""
    tensor = onnx.helper.make_tensor("evil", onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value="/etc/hostname")
    tensor.external_data.add(key="length", value="8")
    return tensor


def _constant_external(folder: Path, _: Path) -> None:
    path = folder / _files(folder)[0]
    model = onnx.load(str(path), load_external_data=False)
    tensor = _outside_tensor()
    model.graph.node.append(
        onnx.helper.make_node("Constant", [], ["evil_out"], value=tensor, name="evil")
    )
    onnx.save(model, str(path))


def _function_constant_external(folder: Path, _: Path) -> None:
    path = folder / _files(folder)[0]
    model = onnx.load(str(path), load_external_data=False)
    tensor = _outside_tensor()
    body = [onnx.helper.make_node("Constant", [], ["y"], value=tensor)]
    opsets = [onnx.helper.make_opsetid("", 20)]
    model.functions.append(onnx.helper.make_function("local", "evil", [], ["y"], body, opsets))
    model.opset_import.add(domain="local", version=1)
    model.graph.node.append(onnx.helper.make_node("evil", [], ["evil_out"], domain="local"))
    onnx.save(model, str(path))


def _weights_tensor(name: str) -> onnx.TensorProto:
    """A tensor whose data is declared external, inside the set's own weights file (its first
    8 bytes): what docs/onnx.md says only a top-graph initializer may do."""
    tensor = onnx.helper.make_tensor(name, onnx.TensorProto.FLOAT, [2], [1.0, 2.0])
    tensor.ClearField("float_data")
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=f"{NAME}.data")
    tensor.external_data.add(key="offset", value="0")
    tensor.external_data.add(key="length", value="8")
    return tensor


def _sparse_constant_weights(folder: Path, _: Path) -> None:
    path = folder / _files(folder)[0]
    model = onnx.load(str(path), load_external_data=False)
    indices = onnx.helper.make_tensor("evil_indices", onnx.TensorProto.INT64, [2], [0, 3])
    sparse = onnx.helper.make_sparse_tensor(_weights_tensor("evil_values"), indices, [4])
    node = onnx.helper.make_node("Constant", [], ["evil_out"], sparse_value=sparse, name="evil")
    model.graph.node.append(node)
    model.graph.output.append(onnx.helper.make_tensor_value_info("evil_out", 1, [4]))
    onnx.save(model, str(path))


def _function_default_weights(folder: Path, _: Path) -> None:
    path = folder / _files(folder)[0]
    model = onnx.load(str(path), load_external_data=False)
    default = onnx.helper.make_attribute("w", _weights_tensor("evil_default"))
    constant = onnx.helper.make_node("Constant", [], ["y"])
    constant.attribute.append(onnx.helper.make_attribute_ref("value", onnx.AttributeProto.TENSOR))
    constant.attribute[0].ref_attr_name = "w"
    opsets = [onnx.helper.make_opsetid("", 20)]
    function = onnx.helper.make_function(
        "local", "evil", [], ["y"], [constant], opsets, attribute_protos=[default]
    )
    model.functions.append(function)
    model.opset_import.add(domain="local", version=1)
    model.graph.node.append(onnx.helper.make_node("evil", [], ["evil_out"], domain="local"))
    model.graph.output.append(onnx.helper.make_tensor_value_info("evil_out", 1, [2]))
    onnx.save(model, str(path))


def _loop(trips: int | None) -> Callable[[Path, Path], None]:
    """A Loop of `trips` iterations (None: no trip count, only a condition that stays true)."""

    def change(folder: Path, _: Path) -> None:
        path = folder / _files(folder)[0]
        model = onnx.load(str(path), load_external_data=False)
        helper, tp = onnx.helper, onnx.TensorProto
        body = helper.make_graph(
            [helper.make_node("Identity", ["cond"], ["cond_out"])],
            "body",
            [helper.make_tensor_value_info("i", tp.INT64, []),
             helper.make_tensor_value_info("cond", tp.BOOL, [])],
            [helper.make_tensor_value_info("cond_out", tp.BOOL, [])],
        )  # fmt: skip
        nodes = [helper.make_node("Constant", [], ["go"], value_int=1)]
        if trips is not None:
            count = helper.make_tensor("n", tp.INT64, [], [trips])
            nodes.append(helper.make_node("Constant", [], ["trips"], value=count))
        nodes.append(
            helper.make_node("Loop", ["trips" if trips else "", "go"], [], body=body, name="spin")
        )
        model.graph.node.extend(nodes)
        onnx.save(model, str(path))

    return change


def _random_model(folder: Path, _: Path) -> None:
    (folder / _files(folder)[0]).write_bytes(os.urandom(4096))


def _truncated_weights(folder: Path, _: Path) -> None:
    path = folder / f"{NAME}.data"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _linked(which: str) -> Callable[[Path, Path], None]:
    def change(folder: Path, _: Path) -> None:
        name = _files(folder)[0] if which == "model" else f"{NAME}.data"
        (folder / name).rename(folder / f"real-{name}")
        os.symlink(folder / f"real-{name}", folder / name)

    return change


def _manifest(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, Path], None]:
    def change(folder: Path, _: Path) -> None:
        path = folder / f"{NAME}.json"
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return change


def _swap_model(folder: Path, zeroed: Path) -> None:
    for name in _files(folder):  # same inputs and outputs, zeroed weights
        shutil.copy(zeroed / name, folder / name)
    shutil.copy(zeroed / f"{NAME}.data", folder / f"{NAME}.data")


def _swap_weights(folder: Path, _: Path) -> None:
    path = folder / f"{NAME}.data"
    path.write_bytes(b"\0" * path.stat().st_size)


SEALED = "sealed"  # the manifest's digests rewritten after the change
SWAPPED = "swapped"  # the files changed under an intact manifest

CASES: dict[str, tuple[Callable[[Path, Path], None], str, str]] = {
    "external data at ../": (_location(f"../{NAME}.data"), SEALED, "references '../"),
    "external data at an absolute path": (_location("/etc/hostname"), SEALED, "'/etc/hostname'"),
    "external data in another file": (_location("other.bin"), SEALED, "references 'other.bin'"),
    "offset past the end": (_field("offset", lambda i: 1 << 40), SEALED, "which holds"),
    "length past the end": (_field("length", lambda i: 1 << 40), SEALED, "which holds"),
    "negative offset": (_field("offset", lambda i: -64), SEALED, "which holds"),
    "negative length": (_field("length", lambda i: -4), SEALED, "which holds"),
    "short length": (_field("length", lambda i: int(i["length"]) // 2), SEALED, "does not fit"),
    "long length": (_field("length", lambda i: int(i["length"]) + 4), SEALED, "which holds"),
    "no length": (_drop_length, SEALED, "has no valid offset and length"),
    "custom-domain op": (_custom_domain("evil.ops"), SEALED, "of the domain 'evil.ops'"),
    "external data in a Constant": (_constant_external, SEALED, "references external data"),
    "external data in a function's Constant": (
        _function_constant_external,
        SEALED,
        "references external data",
    ),
    # the two constant forms that read the set's own weights file
    "a sparse Constant reading the weights file": (
        _sparse_constant_weights,
        SEALED,
        "tensor 'evil_values' references external data",
    ),
    "a function's default attribute reading the weights file": (
        _function_default_weights,
        SEALED,
        "tensor 'evil_default' references external data",
    ),
    # a loop's work is bounded at load (onnxruntime would spin in C++)
    "a Loop of 10**15 trips": (_loop(10**15), SEALED, "would run 1,000,000,000,000,000 times"),
    "a Loop without a trip count": (_loop(None), SEALED, "has no trip count"),
    "random bytes as a model file": (_random_model, SEALED, "is not an ONNX model"),
    "truncated weights file": (_truncated_weights, SEALED, "which holds"),
    "linked model file": (_linked("model"), SEALED, "missing or not a regular file"),
    "linked weights file": (_linked("weights"), SEALED, "missing or not a regular file"),
    "a file outside the folder": (
        _manifest(lambda d: d["programs"][0].update(file="../elsewhere.onnx")),
        SEALED,
        "is not a file name beside the manifest",
    ),
    "a file without a digest": (
        _manifest(lambda d: d["digests"].pop(next(iter(d["digests"])))),
        SWAPPED,
        "its digests do not describe the set's files",
    ),
    # parsers have limits; one line from both, never a RecursionError
    "a condition nested 1990 deep": (
        _manifest(
            lambda d: (
                d["programs"][0]
                .setdefault("conditions", [])
                .append({"expr": "-" * 1990 + "d0 > 1", "text": "x"})
            )
        ),
        SEALED,
        "nests deeper than 200 levels",
    ),
    "a manifest value nested 500 deep": (
        _manifest(lambda d: d["programs"][0].update(extra=json.loads("[" * 500 + "]" * 500))),
        SEALED,
        "nests deeper than 200 levels of lists and objects",
    ),
    "swapped model file": (_swap_model, SWAPPED, "its sha256 differs"),
    "swapped weights file": (_swap_weights, SWAPPED, "its sha256 differs"),
}
"""Case -> (change, whether the digests are rewritten, a part of the one-line refusal)."""


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_onnx_set_gets_one_verdict_and_runs_nothing(
    case: str, sets: tuple[Path, Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    store, original, zeroed = sets
    folder = tmp_path / "set"
    shutil.copytree(original, folder)
    change, seal, message = CASES[case]
    change(folder, zeroed)
    if seal == SEALED:
        _reseal(folder)
    refused = both(folder / NAME, store, capfd, planted=["/etc/hostname", tmp_path / "other.bin"])
    assert refused is not None and message in refused


def test_the_untouched_set_is_served_by_both(
    sets: tuple[Path, Path, Path], capfd: pytest.CaptureFixture[str]
) -> None:
    store, original, _ = sets
    assert both(original / NAME, store, capfd) is None


def test_a_domain_the_caller_names_passes_the_operator_check(
    sets: tuple[Path, Path, Path], tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # allowed, the node reaches onnxruntime, which has no such operator: one refusal from both
    store, original, zeroed = sets
    folder = tmp_path / "set"
    shutil.copytree(original, folder)
    _custom_domain("evil.ops")(folder, zeroed)
    _reseal(folder)
    refused = both(folder / NAME, store, capfd, allow_ops=["evil.ops"])
    assert refused is not None and "onnxruntime cannot load" in refused


def test_a_swapped_weights_file_is_served_unless_the_weights_are_verified(
    sets: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    _, original, zeroed = sets
    folder = tmp_path / "set"
    shutil.copytree(original, folder)
    _swap_weights(folder, zeroed)
    replay.load(folder / NAME)  # the model files are intact and always verified
    from replay.runtime.guards import ArtifactError

    with pytest.raises(ArtifactError, match="its sha256 differs"):
        replay.load(folder / NAME, verify_weights=True)
