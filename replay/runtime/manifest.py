"""The artifact's manifest, the shared side: a `.pt2`'s whole manifest, an ONNX set's core.

The manifest (``extra/capture_manifest.json`` in the archive) says what the artifact serves:
per program its call group, recorded input structure, guards (`replay.runtime.guards`) and call
form; per module (the model ``""`` and each recorded sub-module) the export's coverage table,
errors and notes; the versions and the store it was exported from. `Manifest.parse` reads it
into frozen dataclasses, checking every field's type and bounds (`replay.runtime.checked_json`):
a changed manifest is one `ArtifactError` naming the field, never a traceback, and nothing
downstream reads the raw JSON again. Unknown fields are ignored (a newer writer may add
facts an older reader does not need); a change an older reader could misread bumps `FORMAT`.
Needs no torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from capture import schema
from capture.errors import ReplayError, StateError
from capture.pytree.recorded_structure import RecordedLeaf
from capture.signature import Signature
from capture.state import parse_key
from replay.runtime.callform import CallForm
from replay.runtime.checked_json import Fields, checked_format, load, read, to_json
from replay.runtime.conditions import Condition
from replay.runtime.coverage import CoverageRow
from replay.runtime.digests import DIGEST, older
from replay.runtime.fills import Fill
from replay.runtime.guards import (
    LEAF_FIELDS,
    MAX_RANK,
    Axis,
    ProgramGuard,
    Relation,
)

__all__ = [
    "FORMAT",
    "FORMAT_STATES",
    "FORMATS",
    "MANIFEST_CAP",
    "PROGRAM_NAME",
    "Manifest",
    "ModuleEntry",
    "ProgramEntry",
]

FORMAT = "capture-artifact/2"
"""The manifest's ``format``: bumped when a reader could misread a newer manifest (2: the
manifest holds the digest of every file it describes, `Manifest.digests`)."""

FORMAT_STATES = "capture-artifact/3"
"""The format of a manifest whose programs serve more than one state (`ProgramEntry.state`): a
reader of `FORMAT` only would route a call to another state's program, so it must refuse it.
An artifact of one state keeps `FORMAT`."""

FORMATS = (FORMAT, FORMAT_STATES)
"""The formats this reader reads."""

MANIFEST_CAP = 64 * 2**20
"""Largest manifest read (declared size, checked before reading: 64 MiB)."""

PROGRAM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.,+=<>\[\]-]{0,199}\Z")
"""A program or group name: also an archive file name (``models/<program>.json``), so no
``/``, no leading dot; brackets and comparisons allowed (``prefill[len<=6]``)."""

_MODULE = re.compile(r"(|[A-Za-z_][A-Za-z0-9_.]{0,199})\Z")
_KINDS = frozenset(
    {
        schema.KIND_TENSOR,
        schema.KIND_NONE,
        schema.KIND_INT,
        schema.KIND_FLOAT,
        schema.KIND_BOOL,
        schema.KIND_STR,
        schema.KIND_MISSING,
        schema.KIND_OPAQUE,
    }
)


@dataclass(frozen=True)
class ProgramEntry:
    """One program of the artifact: the call group it serves and how calls reach it.

    Attributes:
        guard: What the program accepts (structure, ranges, refused signatures).
        model_name: The recorded model name of its module (``model`` in the JSON).
        structure_id: The recorded input structure (the store's id, for people and reports).
        calls: Recorded calls of the group.
        signatures: Distinct recorded signatures of the group.
        signature: The recorded method's parameters (JSON), used to describe a live call.
        n_args: Positional arguments of the recorded calls.
        form: How the program is called (`replay.runtime.callform.CallForm`).
        pytree_types: Pytree node types the program's treespecs name.
        fills: Inputs the program takes that the group's calls lack, filled per call (a group
            served by another group's program, `replay.pipeline.merging`; empty otherwise).
        first_ts: First recorded call of the group (ISO text), if known.
        last_ts: Last recorded call of the group (ISO text), if known.
        state: The state key its calls ran under (`capture.state`; ``""``: the default
            state): the runner serves it only to a call of that state.
    """

    guard: ProgramGuard
    model_name: str
    structure_id: str
    calls: int
    signatures: int
    signature: str | None
    n_args: int
    form: CallForm
    pytree_types: tuple[str, ...] = ()
    fills: tuple[Fill, ...] = ()
    first_ts: str | None = None
    last_ts: str | None = None
    state: str = ""

    @property
    def program(self) -> str:
        """The program's name inside the archive."""
        return self.guard.program

    @property
    def module_name(self) -> str:
        """The sub-module it serves (``""``: the model itself; ``module`` in the JSON)."""
        return self.guard.module_name

    @property
    def group(self) -> str:
        """The call group it serves."""
        return self.guard.group

    def as_dict(self) -> dict[str, Any]:
        """The entry as the manifest's JSON object."""
        g = self.guard
        return {
            "module": g.module_name,
            "group": g.group,
            "program": g.program,
            "model": self.model_name,
            "structure_id": self.structure_id,
            "calls": self.calls,
            "signatures": self.signatures,
            "treespec": g.treespec,
            "signature": self.signature,
            "n_args": self.n_args,
            "leaves": [
                {k: getattr(leaf, k) for k in ("argument", "position", *LEAF_FIELDS)}
                for leaf in g.leaves
            ],
            "axes": to_json(g.axes),
            "relations": to_json(g.relations),
            "form": to_json(self.form),
            "pytree_types": list(self.pytree_types),
            "rejected": [{"dims": list(d), "error": e} for d, e in g.rejected.items()],
            "fills": to_json(self.fills),
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            # Only a program that does not check its own size guards (an ONNX file) has any.
            **({"conditions": to_json(g.conditions)} if g.conditions else {}),
            **({"state": self.state} if self.state else {}),
        }

    @classmethod
    def parse(cls, f: Fields) -> ProgramEntry:
        """Reads one ``programs`` item.

        Raises:
            ArtifactError: A field is missing, of the wrong type or out of bounds.
        """
        leaves = tuple(
            _leaf(i, Fields(item, f"{f.where}.leaves[{i}]"))
            for i, item in enumerate(f.items("leaves"))
        )
        axes = tuple(f.each_of("axes", Axis))
        width = sum(leaf.rank or 0 for leaf in leaves if leaf.is_tensor)
        if width != len(axes):
            f.fail(f"{f.where}.axes", f"has {len(axes)} axes for {width} recorded tensor dims")
        rejected: dict[tuple[int, ...], str] = {}
        for r in f.each("rejected", lambda r: r, optional=True):
            dims = r.integers("dims", low=0)
            if len(dims) != len(axes):
                f.fail(r.where, f"has {len(dims)} dims for {len(axes)} axes")
            rejected[dims] = r.text("error")
        signature = f.text("signature", optional=True, max_len=1_000_000)
        try:
            Signature.loads(signature)
        except ReplayError as e:
            f.fail(f"{f.where}.signature", f"is malformed ({e})")
        guard = ProgramGuard(
            module_name=f.text("module", optional=True, pattern=_MODULE) or "",
            group=f.text("group", pattern=PROGRAM_NAME),
            program=f.text("program", pattern=PROGRAM_NAME),
            treespec=f.text("treespec", optional=True, max_len=10_000_000),
            leaves=leaves,
            axes=axes,
            relations=tuple(f.each_of("relations", Relation, optional=True)),
            rejected=rejected,
            conditions=tuple(f.each_of("conditions", Condition, optional=True)),
        )
        return cls(
            guard=guard,
            model_name=f.text("model"),
            structure_id=f.text("structure_id", max_len=256),
            calls=f.integer("calls", low=0),
            signatures=f.integer("signatures", low=0),
            signature=signature,
            n_args=f.integer("n_args", low=0, high=100_000),
            form=f.one("form", CallForm),
            pytree_types=tuple(f.texts("pytree_types", optional=True, max_len=512)),
            fills=tuple(
                Fill.from_dict(item, len(axes), f"{f.where}.fills[{i}]")
                for i, item in enumerate(f.items("fills", optional=True, max_items=1024))
            ),
            first_ts=f.text("first_ts", optional=True, max_len=64),
            last_ts=f.text("last_ts", optional=True, max_len=64),
            state=_state(f),
        )


def _state(f: Fields) -> str:
    """The entry's state key, checked to be one `capture.state` writes (``""``: default)."""
    key = f.text("state", optional=True, max_len=4096) or ""
    try:
        parse_key(key or None)
    except StateError as e:
        f.fail(f"{f.where}.state", f"is malformed ({e})")
    return str(key)


def _leaf(index: int, leaf: Fields) -> RecordedLeaf:
    return RecordedLeaf(
        leaf=index,
        path=leaf.text("path"),
        argument=leaf.text("argument", optional=True),
        position=leaf.integer("position", low=0, optional=True),
        kind=_kind(leaf),
        dtype=leaf.text("dtype", optional=True, max_len=64),
        rank=leaf.integer("rank", low=0, high=MAX_RANK, optional=True),
        value=leaf.text("value", optional=True),
    )


def _kind(leaf: Fields) -> str:
    kind = leaf.text("kind", max_len=32)
    if kind not in _KINDS:
        leaf.fail(f"{leaf.where}.kind", f"is {kind!r}, not a recorded leaf kind")
    return str(kind)


@dataclass(frozen=True)
class ModuleEntry:
    """One exported module of the artifact (``""`` the model, ``encoder`` a sub-module).

    Attributes:
        model_name: Its recorded model name in the store (``model`` in the JSON).
        store: The store it was exported from (path or URI), if known.
        first: First recorded call of the export's window (ISO text), if known.
        last: Last recorded call of the window (ISO text), if known.
        complete: Every coverage row was covered and every option honoured.
        coverage: The export's coverage table.
        errors: Group -> why torch.export rejected it.
        notes: What was done and why, per group.
    """

    model_name: str = field(metadata={"key": "model"})
    store: str | None
    first: str | None = field(metadata={"key": "window.first", "max_len": 64})
    last: str | None = field(metadata={"key": "window.last", "max_len": 64})
    complete: bool
    coverage: tuple[CoverageRow, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict, metadata={"max_len": 100_000})
    notes: tuple[str, ...] = field(default=(), metadata={"max_len": 100_000})


@dataclass(frozen=True)
class Manifest:
    """An artifact's manifest, validated (`parse`) or built by `replay.artifact.saving.save`.

    Attributes:
        model_name: The model's recorded name (``model`` in the JSON).
        created: When the artifact was written (ISO text).
        versions: torch / transformers / capture versions of the export.
        modules: Module name -> its `ModuleEntry` (``""`` always present).
        programs: One entry per served call group (or regime), in the order the runner tries
            them; several may name one program (merged groups).
        aoti: Whether every program also has an AOTInductor build in the archive.
        format: `FORMAT`.
        digests: File name -> its ``sha256:<hex>`` digest, for every file the manifest
            describes (in a ``.pt2``: every entry but the manifest and torch's format markers;
            in an ONNX set: every model file and the weights file), checked by
            `replay.runtime.digests`.
    """

    model_name: str
    created: str
    versions: Mapping[str, str | None]
    modules: Mapping[str, ModuleEntry]
    programs: tuple[ProgramEntry, ...]
    aoti: bool = False
    format: str = FORMAT
    digests: Mapping[str, str] = field(default_factory=dict)

    def for_module(self, module_name: str) -> list[ProgramEntry]:
        """The entries serving `module_name`, in order."""
        return [p for p in self.programs if p.module_name == module_name]

    def states(self, module_name: str = "") -> list[str]:
        """The state keys `module_name`'s programs serve, in the order of their entries."""
        return list(dict.fromkeys(p.state for p in self.for_module(module_name)))

    @property
    def program_names(self) -> list[str]:
        """Every program of the archive, once, in the order of the entries naming them."""
        return list(dict.fromkeys(p.program for p in self.programs))

    def as_dict(self) -> dict[str, Any]:
        """The manifest as JSON-serializable data."""
        return {
            "format": self.format,
            "model": self.model_name,
            "created": self.created,
            "versions": dict(self.versions),
            "aoti": self.aoti,
            "modules": to_json(self.modules),
            "programs": [p.as_dict() for p in self.programs],
            "digests": dict(sorted(self.digests.items())),
        }

    def to_json(self) -> str:
        """The manifest's text as `save` writes it (strict JSON: no NaN)."""
        return json.dumps(self.as_dict(), indent=1, allow_nan=False)

    @classmethod
    def parse(cls, data: bytes, source: str) -> Manifest:
        """Parses and validates a manifest.

        Args:
            data: Its bytes (the caller bounds their size, `MANIFEST_CAP`).
            source: Where they were read (``model.pt2:extra/capture_manifest.json``).

        Returns:
            The typed manifest.

        Raises:
            ArtifactError: Not JSON, another `FORMAT`, or a field missing, of the wrong type or
                out of bounds; a program listed twice, or for a module the manifest lacks.

        Example:
            >>> Manifest.parse(b'{"format": "capture-artifact/0"}', "m.json")  # doctest: +SKIP
            Traceback (most recent call last):
            ArtifactError: m.json: manifest format 'capture-artifact/0', ...
        """
        raw = older(load(data, source), source, ("capture-artifact/1",))
        found = raw.get("format") if isinstance(raw, dict) else None
        return cls.read(checked_format(raw, found if found in FORMATS else FORMAT, source))

    @classmethod
    def read(cls, f: Fields) -> Manifest:
        """Reads a parsed manifest's fields (`parse`; an ONNX set's manifest, `replay.onnx`,
        holds these fields too, under its own format).

        Raises:
            ArtifactError: See `parse`.
        """
        source = f.where
        versions = f.child("versions", optional=True)
        modules_raw = f.child("modules")
        modules = {
            str(name): read(ModuleEntry, modules_raw.raw[name], f"{modules_raw.where}.{name}")
            for name in modules_raw.raw
        }
        if "" not in modules:
            f.fail(f"{source}.modules", "lacks the model's own module ('')")
        for name in modules:
            if not _MODULE.match(name):
                f.fail(f"{source}.modules", f"names the module {name[:60]!r}")
        programs = tuple(f.each("programs", ProgramEntry.parse))
        # One entry per call group; a program may serve several (a merged group's entry names
        # the program of the group serving it).
        seen: set[tuple[str, str]] = set()
        for i, p in enumerate(programs):
            if (p.module_name, p.group) in seen:
                f.fail(f"{source}.programs[{i}]", f"lists the group {p.guard.label} twice")
            if p.module_name not in modules:
                f.fail(
                    f"{source}.programs[{i}]", f"serves the module {p.module_name!r}, not listed"
                )
            seen.add((p.module_name, p.group))
        if not programs:
            f.fail(f"{source}.programs", "is empty")
        states = {(p.module_name, p.state) for p in programs}
        if (
            len(states) > len({p.module_name for p in programs})
            and f.raw.get("format") != FORMAT_STATES
        ):
            f.fail(f"{source}.programs", f"serve several states under format {FORMAT!r}")
        digests = f.child("digests")
        for name in digests.raw:
            value = digests.raw[name]
            if not (isinstance(value, str) and DIGEST.match(value)) or len(str(name)) > 512:
                f.fail(f"{source}.digests", f"has {str(name)[:60]!r}: not a sha256 digest")
        return cls(
            model_name=f.text("model"),
            created=f.text("created", optional=True, max_len=64) or "",
            versions={str(k): versions.text(k, optional=True, max_len=128) for k in versions.raw},
            modules=modules,
            programs=programs,
            aoti=f.flag("aoti", optional=True),
            format=f.text("format", max_len=64),
            digests={str(k): str(v) for k, v in digests.raw.items()},
        )
