"""The allow-list against the operator census: every operator real models emit is allowed, or
refused with its reason in docs/trust.md.

``tools/op_census.json`` is the checked-in output of ``python tools/op_census.py`` (tiny-config
instances of transformers' architectures and diffusers' blocks exported with torch.export on
CPU); the slow test runs the census again on a few architectures, with this torch and
transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replay.runtime.pt2.op_table import REFUSED_OPS
from replay.runtime.pt2.operators import op_kind

ROOT = Path(__file__).resolve().parents[1]
CENSUS = json.loads((ROOT / "tools/op_census.json").read_text())


def _unexplained(ops: list[str]) -> list[str]:
    """The operators neither allowed nor refused with a reason docs/trust.md gives."""
    trust = " ".join((ROOT / "docs/trust.md").read_text().split())
    out = []
    for op in ops:
        name = op.removeprefix("torch.ops.aten.")
        shown = f"aten.{name}" if name != op else op  # as docs/trust.md lists it
        if op_kind(op) is not None:
            continue
        if name in REFUSED_OPS and f"`{shown}`: {REFUSED_OPS[name]}" in trust:
            continue
        out.append(op)
    return out


def test_the_census_covers_every_family() -> None:
    families = {a["family"] for a in CENSUS["architectures"].values() if a["status"] == "exported"}
    assert {"MODEL_FOR_CAUSAL_LM", "diffusers"} <= families
    assert CENSUS["exported"] >= 50 and CENSUS["tried"] == len(CENSUS["architectures"])


def test_every_census_operator_is_allowed_or_refused_with_its_reason() -> None:
    assert _unexplained(sorted(CENSUS["ops"])) == []


def test_every_failed_architecture_says_why() -> None:
    failed = [a for a in CENSUS["architectures"].values() if a["status"] != "exported"]
    assert all(a["reason"] for a in failed)


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "mixtral", "qwen2_moe", "t5", "vit"])
def test_a_fresh_census_emits_only_explained_operators(model_type: str) -> None:
    from tools.op_census import _transformers_job, census_one, classes

    (found,) = [(t, c) for t, c, _ in classes() if t == model_type]
    entry = census_one(f"{found[0]}:{found[1]}", _transformers_job(*found))
    assert entry["status"] == "exported", entry["reason"]
    assert entry["ops"] and _unexplained(entry["ops"]) == []
