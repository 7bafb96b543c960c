"""The quickstart installs what the demo and the report need, and nothing test-only.

The whole path (a fresh clone, a scratch venv, the quickstart command, then `capture report`) is
measured by hand and written up in docs/benchmarks.md; these tests keep its two promises: the
README's install lines agree, and the ``demo`` extra holds what `capture demo` and `capture
report` import, no test dependency.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _install_lines(text: str) -> list[str]:
    return re.findall(r"pip install -e '?(\.[^' ]*)'?", text)


def _extra(name: str) -> set[str]:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (body,) = re.findall(rf"^{name} = \[(.*?)\]$", pyproject, flags=re.M | re.S)
    return {re.split(r"[<>=\[ ]", d)[0] for d in re.findall(r'"([^"]+)"', body)}


def test_readme_install_line_and_quickstart_install_the_demo_extra() -> None:
    # both install the demo extra, which draws `capture report`, not `.[test]` (86 packages,
    # 2.2 GB with pyspark, moto, pytest).
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quickstart = readme[readme.index("## Quickstart") :]
    assert _install_lines(readme)[0] == ".[demo]"
    assert _install_lines(quickstart)[0] == ".[demo]"
    assert "&& capture demo" in quickstart


def test_demo_extra_holds_what_demo_and_report_import_and_nothing_test_only() -> None:
    demo = _extra("demo")
    assert demo == {"transformers", "matplotlib"}  # capture.demo_model, capture report
    assert not demo & _extra("test") - {"transformers"}
    assert not demo & {"pytest", "moto", "pyspark", "hypothesis", "boto3"}


def test_no_doc_example_imports_the_repository_fixtures() -> None:
    # `fixtures` is not installed, so no doc example imports it.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    offending = [
        p.name
        for p in pages
        if re.search(r"^\s*(from|import) fixtures\b", p.read_text(encoding="utf-8"), re.M)
    ]
    assert offending == []
