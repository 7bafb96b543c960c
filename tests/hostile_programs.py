"""Hostile program graphs, weights and archives: the cases test_hostile_artifact.py adds.

Each case is ``make(marker) -> change(entries)``, as the other cases of that suite: `marker` is
the file planted code would write; the change edits the archive's entries (and reseals the
manifest's digests, as an attacker would, unless it says ``"__sealed__": False``). A change may
ask for a raw zip (``"__zip__"``: bytes before it, a linked entry, another root folder) where
torch's writer could not write the damage. `planted(marker)` lists the files outside the
artifact the cases aim at (none may be opened).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["PROGRAM_CASES", "planted", "write_raw"]

Change = Callable[[dict[str, bytes]], None]


def planted(marker: Path) -> list[Path | str]:
    """The paths outside the artifact the cases aim at."""
    return [_victim(marker), marker.parent / "new.bin", "/etc/hostname"]


def _victim(marker: Path) -> Path:
    return marker.parent / "victim.bin"


def _program(entries: dict[str, bytes]) -> str:
    return next(n for n in entries if n.startswith("models/") and n.endswith("g0.json"))


def _edit(entries: dict[str, bytes], name: str, edit: Callable[[Any], None]) -> None:
    data = json.loads(entries[name])
    edit(data)
    entries[name] = json.dumps(data).encode()


def _arg(name: str, **value: Any) -> dict[str, Any]:
    return {"name": name, "arg": value, "kind": 1}


def _nodes(*nodes: dict[str, Any]) -> Callable[[Path], Change]:
    """Adds nodes at the start of g0's graph, with the tensor metadata of their outputs."""

    def make(marker: Path) -> Change:
        _victim(marker).write_bytes(b"original")

        text = json.dumps(list(nodes)).replace("{VICTIM}", str(_victim(marker)))
        added = json.loads(text.replace("{NEW}", str(marker.parent / "new.bin")))

        def change(e: dict[str, bytes]) -> None:
            def edit(d: Any) -> None:
                graph = d["graph_module"]["graph"]
                meta = next(iter(graph["tensor_values"].values()))
                for node in added:
                    for out in node["outputs"]:
                        graph["tensor_values"][out["as_tensor"]["name"]] = meta
                graph["nodes"][:0] = added

            _edit(e, _program(e), edit)

        return change

    return make


def _node(target: str, inputs: list[dict[str, Any]], out: str) -> dict[str, Any]:
    return {
        "target": target,
        "inputs": inputs,
        "outputs": [{"as_tensor": {"name": out}}],
        "metadata": {},
        "is_hop_single_tensor_return": None,
        "name": out,
    }


def _from_file(path: str, shared: bool) -> dict[str, Any]:
    return _node(
        "torch.ops.aten.from_file.default",
        [
            _arg("filename", as_string=path),
            _arg("shared", as_bool=shared),
            _arg("size", as_int=8),
            _arg("dtype", as_scalar_type=1),
        ],
        "evil",
    )


def _fill(target: str) -> dict[str, Any]:
    return _node(
        "torch.ops.aten.fill_.Scalar",
        [_arg("self", as_tensor={"name": target}), _arg("value", as_int=65)],
        "evil_fill",
    )


def _first_param(entries: dict[str, bytes]) -> str:
    specs = json.loads(entries[_program(entries)])["graph_module"]["signature"]["input_specs"]
    return next(s["parameter"]["arg"]["name"] for s in specs if "parameter" in s)


def _fill_parameter(marker: Path) -> Change:
    def change(e: dict[str, bytes]) -> None:
        _nodes(_fill(_first_param(e)))(marker)(e)

    return change


def _expr(text: str) -> Callable[[Path], Change]:
    def make(marker: Path) -> Change:
        def change(e: dict[str, bytes]) -> None:
            def edit(d: Any) -> None:
                values = d["graph_module"]["graph"]["sym_int_values"]
                if not values:
                    values["s_evil"] = {"as_expr": {"expr_str": text, "hint": None}}
                for value in values.values():
                    value["as_expr"]["expr_str"] = text

            _edit(e, _program(e), edit)

        return change

    return make


def _spec_type(marker: Path) -> Change:
    def change(e: dict[str, bytes]) -> None:
        def edit(d: Any) -> None:
            entry = d["graph_module"]["module_call_graph"][0]["signature"]
            protocol, root = json.loads(entry["in_spec"])
            root["children_spec"][0]["type"] = "os.system"
            entry["in_spec"] = json.dumps([protocol, root])

        _edit(e, _program(e), edit)

    return change


def _deep(marker: Path) -> Change:
    def change(e: dict[str, bytes]) -> None:
        def edit(d: Any) -> None:
            nested: list[Any] = []
            for _ in range(300):
                nested = [nested]
            d["graph_module"]["graph"]["nodes"][0]["metadata"] = {"nested": nested}

        _edit(e, _program(e), edit)

    return change


def _weights_config(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path], Change]:
    def make(marker: Path) -> Change:
        def change(e: dict[str, bytes]) -> None:
            _edit(e, "data/weights/g0_weights_config.json", lambda d: edit(d["config"]))

        return change

    return make


def _missing_parameter(config: dict[str, Any]) -> None:
    config.pop(next(iter(config)))


def _bool_weight(config: dict[str, Any]) -> None:
    meta = next(iter(config.values()))
    meta["is_param"] = True
    meta["tensor_meta"].update(dtype=12, requires_grad=True)


def _raw(**options: Any) -> Callable[[Path], Change]:
    def make(marker: Path) -> Change:
        def change(e: dict[str, bytes]) -> None:
            e["__zip__"] = json.dumps(options).encode()

        return change

    return make


def _swap_record(marker: Path) -> Change:
    def change(e: dict[str, bytes]) -> None:
        name = next(n for n in e if n.startswith("data/weights/weight_"))
        e[name] = b"\0" * len(e[name])
        e["__sealed__"] = b""

    return change


def write_raw(path: Path, content: dict[str, bytes], options: dict[str, Any]) -> Path:
    """Writes the entries with `zipfile` (unaligned), as `options` asks: ``junk`` bytes before
    the zip, ``link`` (an entry marked as a symbolic link), ``misaligned`` (a root folder name
    that leaves a float record at an offset that is not a multiple of 4)."""
    for root in ("a", "ab", "abc", "abcd") if options.get("misaligned") else ("archive",):
        with zipfile.ZipFile(path, "w") as z:
            for name, data in content.items():
                info = zipfile.ZipInfo(f"{root}/{name}")
                if name == options.get("link"):
                    info.external_attr = 0o120777 << 16
                z.writestr(info, data, compress_type=zipfile.ZIP_STORED)
        if not options.get("misaligned"):
            break
        with zipfile.ZipFile(path) as z:
            info = next(i for i in z.infolist() if "/data/weights/weight_" in i.filename)
            start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        if start % 4:
            break
    if options.get("junk"):
        path.write_bytes(b"JUNK" * 16 + path.read_bytes())
    return path


PROGRAM_CASES: dict[str, tuple[Callable[[Path], Change], str]] = {
    # the runner's first call would overwrite the first 8 bytes of victim.bin
    "aten.from_file then fill_": (
        _nodes(_from_file("{VICTIM}", True), _fill("evil")),
        "calls 'torch.ops.aten.from_file.default'",
    ),
    "aten.from_file of a new file": (
        _nodes(_from_file("{NEW}", True)),
        "calls 'torch.ops.aten.from_file.default'",
    ),
    "aten.from_file of /etc/hostname": (
        _nodes(_from_file("/etc/hostname", False)),
        "calls 'torch.ops.aten.from_file.default'",
    ),
    "aten._print": (
        _nodes(_node("torch.ops.aten._print.default", [_arg("s", as_string="hi")], "p")),
        "calls 'torch.ops.aten._print.default'",
    ),
    "custom operator namespace": (
        _nodes(_node("torch.ops.evil_ns.run.default", [], "run")),
        "calls 'torch.ops.evil_ns.run.default'",
    ),
    "fill_ of a parameter": (_fill_parameter, "a parameter; a program may write only"),
    "power bomb": (_expr("Integer(10)**Integer(10)**Integer(12)"), "not a literal of at most"),
    "power bomb (sympy form)": (
        _expr("Pow(Integer(10), Pow(Integer(10), Integer(12)))"),
        "not a literal of at most",
    ),
    "huge integer": (_expr("Integer(" + "9" * 1000 + ")"), "an integer constant above 2**64"),
    "deep expression": (_expr("Abs(" * 150 + "s0" + ")" * 150), "levels of nesting"),
    "hostile pytree type in a treespec": (_spec_type, "the pytree type 'os.system'"),
    "graph nested 300 levels deep": (_deep, "deeper than 200 levels"),
    "missing parameter": (_weights_config(_missing_parameter), "torch cannot read this program"),
    "bool weight with requires_grad": (
        _weights_config(_bool_weight),
        "only floating and complex tensors have gradients",
    ),
    "misaligned weight record": (_raw(misaligned=True), "is not aligned for float32"),
    "junk before the zip": (_raw(junk=True), "holds data before its first entry"),
    "linked weight": (_raw(link="data/weights/weight_0"), "is a link or a special file"),
    "weight record swapped, same size": (_swap_record, "its sha256 differs"),
}
"""Case name -> (make, a part of the one-line refusal)."""
