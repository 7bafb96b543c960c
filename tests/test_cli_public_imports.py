"""The `capture` command is a thin layer over the public API (STYLE: import only what a
package's ``__init__`` exports): a static check over every import of ``cli/*.py``, at module
level, inside functions and under ``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
from pathlib import Path

import capture
import capture.cli
import replay

CLI = Path(capture.cli.__path__[0])
PUBLIC = {"capture": set(capture.__all__), "replay": set(replay.__all__)}

# The imports of internal modules the commands still make, each with what keeps it; the list
# may only shrink: a new internal import fails `test_the_cli_imports_only_public_names`.
STILL_INTERNAL = {
    ("engines.py", "capture.analysis.symbol_sizes"): "BATCH, the kind of a batch symbol",
    ("query.py", "capture.store_api"): "the query command's store",
    ("query.py", "replay.inputs.source"): "dims --python",
    ("query.py", "replay.loader"): "summary --artifact",
    ("query.py", "replay.runtime.routes"): "summary --artifact",
    ("report.py", "capture.engines.report_html"): "the HTML page",
    ("report.py", "replay.inputs.source"): "the export plan the page shows",
    ("summary_table.py", "capture.analysis"): "the summary's rows (its module, summary)",
}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names imported from it) of every import statement of a file."""
    found: list[tuple[str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def _internal() -> set[tuple[str, str]]:
    internal = set()
    for path in sorted(CLI.glob("*.py")):
        for module, names in _imports(path):
            top = module.split(".")[0]
            if top not in PUBLIC:
                continue
            if module != top or not set(names) <= PUBLIC[top]:
                internal.add((path.name, module))
    return internal


def test_the_cli_imports_only_public_names() -> None:
    assert _internal() - set(STILL_INTERNAL) == set()


def test_the_list_of_internal_imports_is_current() -> None:
    assert set(STILL_INTERNAL) - _internal() == set()


def test_the_reader_sees_imports_inside_functions_and_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from replay.loader import load\n"
        "def f():\n    import capture.store_api\n    from capture import open_store\n",
        encoding="utf-8",
    )
    assert _imports(source) == [
        ("typing", ["TYPE_CHECKING"]),
        ("replay.loader", ["load"]),
        ("capture.store_api", []),
        ("capture", ["open_store"]),
    ]
