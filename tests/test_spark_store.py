"""Spark (pyspark, local mode) reads the store as docs/operations.md says; it agrees with dims.

The "Spark, Trino, Athena" section of docs/operations.md is run as written: its python
block (Spark reading the files `open_store(...).files` lists) and its SQL, on a recorded
tiny-Llama store; the result must equal `capture dims`' min / max / distinct / calls row for row.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

import capture

ROOT = Path(__file__).resolve().parents[1]
KEY = ("model", "structure_id", "path", "axis")
VALUES = ("min", "max", "distinct", "calls")


def _page_block(marker: str, lang: str) -> str:
    """The fenced `lang` block right after ``<!-- marker... -->`` in docs/operations.md."""
    text = (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")
    match = re.search(
        rf"^<!-- {re.escape(marker)}[^>]*-->\n```{lang}\n(.*?)^```$", text, re.S | re.M
    )
    assert match, f"docs/operations.md has no {lang} block after <!-- {marker} -->"
    return match.group(1)


@pytest.fixture(scope="module")
def spark_rows(llama_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The operations page's Spark block and SQL, run where the store is ./capture-store."""
    import pyspark  # noqa: F401  (the test extra installs it: a missing one fails here)

    if shutil.which("java") is None:
        pytest.fail("Spark needs java on PATH (.ci/run installs openjdk-17-jre-headless)")
    workdir = tmp_path_factory.mktemp("spark")
    shutil.copytree(llama_root, workdir / "capture-store")
    namespace: dict[str, Any] = {"DIMS_SQL": _page_block("spark-dims-sql", "sql")}
    here = os.getcwd()
    os.chdir(workdir)
    try:
        exec(compile(_page_block("spark-read", "python"), "docs/operations.md", "exec"), namespace)
        rows = [row.asDict() for row in namespace["rows"]]
    finally:
        namespace["spark"].stop()
        os.chdir(here)
    return rows


@pytest.mark.slow
def test_spark_sql_of_the_operations_page_agrees_with_capture_dims(
    spark_rows: list[dict[str, Any]], llama_root: Path
) -> None:
    with capture.open_store(llama_root) as store:
        dims = store.dims().to_pylist()
    ours = sorted(tuple(r[k] for k in KEY + VALUES) for r in dims)
    theirs = sorted(tuple(r[k] for k in KEY + VALUES) for r in spark_rows)
    assert len(ours) > 10
    assert theirs == ours  # row for row
