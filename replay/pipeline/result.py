"""What `replay.export` returns: the chain's outcomes, frozen, and `save`, the one ship step.

An `ExportResult` is built once and never changed: its parts are the chain's typed per-group
outcomes (`replay.pipeline.chain.Part`: program, coverage rows, error, notes), the rows of the
sampled real calls, and, when ONNX was written, the ONNX outcome (`replay.onnx.target`).
``programs``, ``coverage``, ``errors``, ``not_honoured``, ``onnx``, ``notes`` and ``complete``
are read from them.

`ExportResult.save` writes every artifact: a ``.pt2`` (`replay.artifact.saving`), an ONNX set
(`replay.onnx.target`: converted, written, then checked with onnxruntime against the original
calls as the torch programs were) or both in one call. It returns a `Saved`: the paths written
and the result as shipped, whose coverage holds the ONNX rows. ``export(..., onnx=PATH)`` is
the same step taken at the end of the export.

`ExportResult` lives apart from the export pipeline (`replay.pipeline.exporting`) so that the
artifact saver never imports the pipeline back: it reads a result through the fields it needs
(`replay.artifact.entries.SavedResult`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from replay.inputs.exportgroup import ExportInputs
from replay.inputs.options import ExportOptions
from replay.runtime.coverage import CoverageRow, coverage_table

if TYPE_CHECKING:
    from torch.export import ExportedProgram

    from capture.store.reader import StoreReader
    from replay.inputs.builder import StoreSource
    from replay.onnx.target import OnnxOutcome
    from replay.pipeline.chain import Part

__all__ = ["ExportResult", "Origin", "Saved"]


@dataclass(frozen=True)
class Origin:
    """What the programs were exported from, for the ONNX check at `ExportResult.save`.

    Attributes:
        model: The eager model (``nn.Module``) the programs are checked against.
        store: The store as `replay.export` was given it: a path or URI is opened again at
            save, an open `capture.Store` is read as it is.
        options: The export's options (tolerances, payload limits, device, state setter).
    """

    model: Any
    store: StoreSource
    options: ExportOptions


@dataclass(frozen=True)
class ExportResult:
    """What `export` returns: frozen; every field below the attributes is read from them.

    Attributes:
        parts: The chain's outcome of every group, regime and static program, in the order
            they were exported (`replay.pipeline.chain.Part`).
        inputs: The export inputs the programs were exported from.
        payloads: The coverage rows of the sampled real calls (`replay.check.payload_rows`).
        payload_notes: What the payload check says (``"payloads: ..."``).
        onnx_outcome: What the ONNX step wrote and checked (`replay.onnx.target.OnnxOutcome`;
            None: no ONNX was written).
        source: The store the programs were exported from (its path or URI), for the artifact.
        modules: Sub-module name -> its export (``export(..., modules=True)``; empty otherwise).
        origin: The model, store and options, for `save` to check an ONNX set; None for a
            result that cannot ship ONNX.
    """

    parts: tuple[Part, ...]
    inputs: ExportInputs
    payloads: tuple[CoverageRow, ...] = ()
    payload_notes: tuple[str, ...] = ()
    onnx_outcome: OnnxOutcome | None = None
    source: str | None = None
    modules: Mapping[str, ExportResult] = field(default_factory=dict)
    origin: Origin | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        # A copy the caller cannot change underneath: the result stays as it was built.
        object.__setattr__(self, "modules", MappingProxyType(dict(self.modules)))

    @property
    def programs(self) -> dict[str, ExportedProgram]:
        """Group name -> the group's `torch.export.ExportedProgram`."""
        return {p.group.name: p.program for p in self.parts if p.program is not None}

    @property
    def errors(self) -> dict[str, str]:
        """Group name -> why torch.export (or the loader's check) gave it no program."""
        return {p.group.name: p.error for p in self.parts if p.error is not None}

    @property
    def not_honoured(self) -> dict[str, str]:
        """Group name -> an option asked for that its program does not honour, and why
        (``named_dims``: torch.export accepted no bounded form, the program was exported with
        unbounded ``Dim.DYNAMIC``)."""
        return {p.group.name: p.not_honoured for p in self.parts if p.not_honoured is not None}

    @property
    def onnx(self) -> dict[str, str]:
        """Group name -> path of the ONNX file written (empty when none was)."""
        return dict(self.onnx_outcome.files) if self.onnx_outcome is not None else {}

    @property
    def torch_rows(self) -> tuple[CoverageRow, ...]:
        """The rows of target ``torch``: every group's, then the sampled real calls'."""
        return (*(row for p in self.parts for row in p.rows), *self.payloads)

    @property
    def rows(self) -> tuple[CoverageRow, ...]:
        """Every coverage row, typed: `torch_rows`, then the ONNX check's (target ``onnx``)."""
        onnx = self.onnx_outcome.rows if self.onnx_outcome is not None else ()
        return (*self.torch_rows, *onnx)

    @property
    def coverage(self) -> pa.Table:
        """`rows` as a table (`COVERAGE_SCHEMA`): one row per distinct recorded signature,
        probe and sampled call, per target."""
        return coverage_table(list(self.rows))

    @property
    def notes(self) -> list[str]:
        """What was done and why, per group (``"<group>: <note>"``), then the payload check's
        and the ONNX step's."""
        onnx = self.onnx_outcome.notes if self.onnx_outcome is not None else ()
        groups = [f"{p.group.name}: {note}" for p in self.parts for note in p.group.notes]
        return [*groups, *self.payload_notes, *onnx]

    @property
    def torch_complete(self) -> bool:
        """Every torch row is covered and every option asked for honoured (sub-modules and
        ONNX rows aside)."""
        rows = self.torch_rows
        return bool(rows) and all(r.covered for r in rows) and not self.not_honoured

    @property
    def complete(self) -> bool:
        """Every row of `coverage` is covered (every kind: recorded signatures, probes,
        payloads; every target: torch and, with ONNX written, ONNX), every option asked for
        was honoured (`not_honoured` is empty), and every sub-module's export is complete."""
        onnx = self.onnx_outcome.rows if self.onnx_outcome is not None else ()
        return (
            self.torch_complete
            and all(r.covered for r in onnx)
            and all(m.complete for m in self.modules.values())
        )

    def all_rows(self) -> Iterator[CoverageRow]:
        """`rows`, then each sub-module's, its groups named ``<module>.<group>``."""
        yield from self.rows
        for name, sub in self.modules.items():
            for row in sub.rows:
                group = None if row.group is None else f"{name}.{row.group}"
                yield dataclasses.replace(row, group=group)

    def all_coverage(self) -> pa.Table:
        """`coverage`, then each sub-module's, its groups named ``<module>.<group>``.

        Example:
            >>> export(model, "store", modules=True).all_coverage()  # doctest: +SKIP
        """
        return coverage_table(list(self.all_rows()))

    def save(
        self,
        path: str | os.PathLike[str] | None = None,
        modules: Mapping[str, ExportResult] | None = None,
        *,
        onnx: str | os.PathLike[str] | None = None,
        aoti: bool = False,
    ) -> Saved:
        """Writes the artifact: a ``.pt2`` archive, an ONNX set, or both.

        A `path` ending in ``.onnx`` writes the ONNX set there; any other `path` writes one
        PT2 archive with every program and a JSON manifest, each weight once
        (`replay.artifact.saving`). `onnx` writes the ONNX set too: ``save("m.pt2",
        onnx="m.onnx")``. An ONNX set is ``PATH`` for one group, ``<stem>.<group>.onnx`` for
        several, their shared weights ``PATH.data`` and a manifest ``PATH.json``; every file is
        checked with onnxruntime on the same rows as the torch programs and on the sampled real
        calls, against the eager model (`replay.onnx.target`): `Saved.result` holds those rows
        (target ``onnx``). Needs ``capture[onnx]`` and the model the result was exported from.

        Args:
            path: The ``.pt2`` (or ``.onnx``) to write.
            modules: Sub-module name -> its `ExportResult` (``{"encoder": ...}``), written in
                the same archive (or set) and served by ``replay.load(path).modules[name]``;
                default: `modules` (those ``export(..., modules=True)`` exported).
            onnx: Also write the ONNX set at this path.
            aoti: Also compile every program with AOTInductor into the ``.pt2``, without its
                weights (``replay.load(path, compiled=True)`` then runs the compiled form).

        Returns:
            A `Saved`: the paths written, usable as the path of what was written first (the
            ``.pt2`` when there is one: ``replay.load(result.save("m.pt2"))``).

        Raises:
            ArtifactError: No program to save, or a group the manifest cannot describe.
            ReplayError: No path at all, an ONNX set without the ONNX dependencies, without
                the eager model, or for calls of several states.
            OutputNotWritable: A folder that is missing, read-only or full.

        Example:
            >>> replay.export(model, "capture-store").save("model.pt2", onnx="model.onnx")
            ... # doctest: +SKIP
        """
        return _save(self, path, self.modules if modules is None else modules, onnx, aoti)


@dataclass(frozen=True)
class Saved(os.PathLike[str]):
    """What `ExportResult.save` wrote.

    Attributes:
        path: The ``.pt2`` written, else the ONNX set's path.
        files: Every file written (the ``.pt2``; the ONNX files, their weights and manifest).
        result: The result as shipped: with the ONNX step's files, rows and notes when an ONNX
            set was written (its ``complete`` then needs every ONNX row covered), else the
            result saved.
    """

    path: str
    files: tuple[str, ...]
    result: ExportResult

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path


def with_onnx(
    result: ExportResult, path: str, modules: Mapping[str, ExportResult], store: StoreReader
) -> ExportResult:
    """`result` (and `modules`, which join the set) with the ONNX set written at `path` and
    checked on the torch rows and the sampled real calls of `store` (`replay.onnx.target`).

    Raises:
        ReplayError: No eager model to check against, or calls of several states.
    """
    from capture.state.entering import entered
    from replay.onnx.target import OnnxPart, require_one_state, write_onnx
    from replay.pipeline.submodules import submodule

    origin = _origin(result)
    require_one_state(result.inputs)
    model = origin.model
    subs = [(m, submodule(model, m), sub) for m, sub in modules.items()]
    parts = [
        OnnxPart(
            module_name,
            module,
            sub.inputs,
            sub.programs,
            sub.errors,
            sub.torch_rows,
            sub.torch_complete,
        )
        for module_name, module, sub in [("", model, result), *subs]
    ]
    state = next(iter({g.state for g in result.inputs.groups}), "")
    with entered(model, state, origin.options.set_state):
        outcomes = write_onnx(parts, path, store, origin.options, source=result.source)
    shipped = {m: dataclasses.replace(sub, onnx_outcome=outcomes[m]) for m, sub in modules.items()}
    return dataclasses.replace(result, onnx_outcome=outcomes[""], modules=shipped)


def _origin(result: ExportResult) -> Origin:
    if result.origin is None:
        from capture.errors import ReplayError

        raise ReplayError(
            "this result holds no model to check an ONNX set against; ship the result "
            "replay.export returned"
        )
    return result.origin


def _save(
    result: ExportResult,
    path: str | os.PathLike[str] | None,
    modules: Mapping[str, ExportResult],
    onnx: str | os.PathLike[str] | None,
    aoti: bool,
) -> Saved:
    """`ExportResult.save`: the paths checked before any work, the ONNX set written and
    checked (in the store `Origin.store` names, opened once), then the ``.pt2``."""
    from capture.errors import ReplayError
    from capture.output_paths import check_file

    text = None if path is None else os.fspath(path)
    onnx_path = None if onnx is None else os.fspath(onnx)
    if text is not None and text.endswith(".onnx"):
        if onnx_path is not None:
            raise ReplayError(f"save({text!r}, onnx={onnx_path!r}) names two ONNX sets; pass one")
        text, onnx_path = None, text
    if text is None and onnx_path is None:
        raise ReplayError("save needs a path: save('model.pt2') or save('model.onnx')")
    files: list[str] = []
    shipped = result
    if onnx_path is not None:
        from replay.inputs.builder import reading
        from replay.onnx.target import require_onnx

        require_onnx()
        check_file(onnx_path, what="ONNX set", example="model.onnx")
        if text is not None:
            check_file(text, what="artifact", example="model.pt2")
        with reading(_origin(result).store) as store:
            shipped = with_onnx(result, onnx_path, modules, store)
        files += _onnx_files(shipped, onnx_path)
    if text is not None:
        from replay.artifact.saving import save

        text = save(text, {"": result, **modules}, aoti=aoti)
        files.insert(0, text)
    return Saved(text or onnx_path or "", tuple(files), shipped)


def _onnx_files(result: ExportResult, path: str) -> list[str]:
    """The ONNX files `result` (and its sub-modules) wrote, their weights and manifest."""
    from replay.runtime.ort.manifest import weights_path

    written = [
        *result.onnx.values(),
        *(f for sub in result.modules.values() for f in sub.onnx.values()),
    ]
    manifest = result.onnx_outcome.manifest if result.onnx_outcome is not None else None
    if not written:
        return []
    return [*written, weights_path(os.path.abspath(path)), *([manifest] if manifest else [])]
