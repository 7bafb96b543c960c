"""The documentation keeps up with the code: schema columns, store views, --help pages."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from capture import schema
from capture.cli.main import COMMANDS, cli
from capture.record.recorder import Recorder
from capture.store_api import open_store

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_MD = ROOT / "docs" / "schema.md"
CLI_MD = ROOT / "docs" / "cli.md"

VIEWS = ("calls", "structures", "leaves", "dims", "stats", "signatures")


def _sections(path: Path) -> dict[str, str]:
    """'### title' heading -> the text up to the next heading of level 2 or 3."""
    text = path.read_text(encoding="utf-8")
    parts = re.split(r"^(#{2,3} .*)$", text, flags=re.M)
    return {parts[i].lstrip("#").strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _table_rows(section: str) -> set[str]:
    """The `names` in the first cell of each markdown table row of a section."""
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `"):
            first = line.split("|")[1]
            names.update(re.findall(r"`([a-z_]+)`", first))
    return names


@pytest.mark.parametrize("table", schema.TABLES)
def test_every_column_of_the_schema_is_documented(table: str) -> None:
    documented = _table_rows(_sections(SCHEMA_MD)[table])
    missing = [name for name in schema.SCHEMAS[table].names if name not in documented]
    assert missing == [], f"docs/schema.md, table {table}: document {missing}"


@pytest.fixture(scope="module")
def store_views(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """View name -> column names, from a real store holding one recorded call."""
    root = tmp_path_factory.mktemp("docs-store")
    model = torch.nn.Linear(4, 2)
    with Recorder(model, root, name="linear"), torch.no_grad():
        model(torch.randn(3, 4))
    with open_store(root) as store:
        return {
            view: [str(r["column_name"]) for r in store.query(f"DESCRIBE {view}").to_pylist()]
            for view in VIEWS
        }


@pytest.mark.parametrize("view", VIEWS)
def test_every_column_of_every_view_is_documented(
    view: str, store_views: dict[str, list[str]]
) -> None:
    section = _sections(SCHEMA_MD)[f"view `{view}`"]
    documented = set(re.findall(r"`([a-z_]+)`", section))
    missing = [name for name in store_views[view] if name not in documented]
    assert missing == [], f"docs/schema.md, view {view}: document {missing}"


@pytest.mark.parametrize(
    "path", ["docs/cli.md", "docs/architecture.md", "docs/recording.md", "README.md"]
)
def test_generated_help_is_up_to_date(path: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cogapp", "--check", path],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"{path} is stale; regenerate it with: python -m cogapp -r {path}\n{result.stdout}"
        f"{result.stderr}"
    )


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_is_documented(name: str) -> None:
    assert f"\n## capture {name}\n" in CLI_MD.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_text_with_an_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"], prog_name="capture")
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output


MARKDOWN = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.*)$", text, flags=re.M)}


@pytest.mark.parametrize("path", MARKDOWN, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_existing_files_and_headings(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target:
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert broken == [], f"{path.name}: broken links {broken}"
