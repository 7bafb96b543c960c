"""What `replay.export` returns: the programs, their coverage table, and `save` to ship them.

`ExportResult` lives apart from the export pipeline (`replay.pipeline.exporting`) so that the
artifact saver (`replay.artifact.saving`) never imports the pipeline back: ``save`` reaches the
writer, the writer reads a result through the fields it needs
(`replay.artifact.entries.SavedResult`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from replay.inputs.exportgroup import ExportInputs

if TYPE_CHECKING:
    from torch.export import ExportedProgram

__all__ = ["ExportResult"]


@dataclass
class ExportResult:
    """What `export` returns.

    Attributes:
        programs: Group name -> the group's `torch.export.ExportedProgram`.
        coverage: One row per distinct recorded signature and per probe (`COVERAGE_SCHEMA`).
        notes: What was done and why, per group (``"<group>: <note>"``).
        complete: Every row of `coverage` is covered (every kind: recorded signatures,
            probes, payloads; every target: torch and, with ``onnx=``, ONNX) and every option
            asked for was honoured (`not_honoured` is empty); with ``modules=True``, every
            sub-module's export is complete too.
        inputs: The export inputs the programs were exported from.
        errors: Group name -> why torch.export rejected it.
        onnx: Group name -> path of the ONNX file written.
        not_honoured: Group name -> an option asked for that its program does not honour, and
            why (``named_dims``: torch.export accepted no bounded form, the program was
            exported with unbounded ``Dim.DYNAMIC``).
    """

    programs: dict[str, ExportedProgram]
    coverage: pa.Table
    notes: list[str]
    complete: bool
    inputs: ExportInputs
    errors: dict[str, str] = field(default_factory=dict)
    onnx: dict[str, str] = field(default_factory=dict)
    not_honoured: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    """The store the programs were exported from (its path or URI), for the artifact."""
    modules: dict[str, ExportResult] = field(default_factory=dict)
    """Sub-module name -> its export (``export(..., modules=True)``; empty otherwise)."""

    def save(
        self,
        path: str | os.PathLike[str],
        modules: Mapping[str, ExportResult] | None = None,
        *,
        aoti: bool = False,
    ) -> str:
        """Writes every program and a JSON manifest into one PT2 archive (`replay.artifact.saving`).

        Every weight is written once, however many programs (and sub-modules) use it.

        Args:
            path: The ``.pt2`` to write.
            modules: Sub-module name -> its `ExportResult` (``{"encoder": ...}``), stored in
                the same archive and served by ``replay.load(path).modules[name]``; default:
                `modules` (those ``export(..., modules=True)`` exported).
            aoti: Also compile every program with AOTInductor into the archive, without its
                weights (``replay.load(path, compiled=True)`` then runs the compiled form).

        Returns:
            The path written.

        Raises:
            ArtifactError: No program to save, or a group the manifest cannot describe.

        Example:
            >>> replay.export(model, "capture-store").save("model.pt2")  # doctest: +SKIP
            'model.pt2'
        """
        from replay.artifact.saving import save

        return save(path, {"": self, **(self.modules if modules is None else modules)}, aoti=aoti)

    def all_coverage(self) -> pa.Table:
        """`coverage`, then each sub-module's, its groups named ``<module>.<group>``.

        Example:
            >>> export(model, "store", modules=True).all_coverage()  # doctest: +SKIP
        """
        tables = [self.coverage]
        for name, sub in self.modules.items():
            groups = [f"{name}.{g}" for g in sub.coverage.column("group").to_pylist()]
            tables.append(sub.coverage.set_column(0, "group", pa.array(groups, pa.string())))
        return pa.concat_tables(tables)
