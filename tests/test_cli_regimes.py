"""`capture export` and `capture summary --artifact` name the regimes.

A real store (the seeds' masked scenario: batches 3 and 4 with a mask, batch 2 without), a
factory whose forward branches on the batch size, real torch.export; exit status, stdout and
stderr checked separately.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture.cli.main import cli
from fixtures.stores import record_seed_scenarios

FACTORY = textwrap.dedent(
    """
    import torch


    class Branchy(torch.nn.Module):
        def forward(self, x, mask=None):
            return x * 2 if x.shape[0] > 3 else x + 1


    def branchy():
        return Branchy()
    """
)

CSV = """\
group,kind,signature,calls,covered,max_abs_diff,error,target,sizes
g0[batch<=3],recorded,x=3x10 mask=3x10,1,true,0.0,,torch,"[3, 10, 3, 10]"
g0[batch>=4],recorded,x=4x10 mask=4x10,1,true,0.0,,torch,"[4, 10, 4, 10]"
g1,recorded,x=2x10,1,true,0.0,,torch,"[2, 10]"
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, tuple[int, str, str]]:
    root = tmp_path_factory.mktemp("regimes")
    record_seed_scenarios(root / "store", names=["masked"])
    (root / "factories.py").write_text(FACTORY)
    target = root / "branchy.pt2"
    args = ["--store", str(root / "store"), "export", f"{root / 'factories.py'}:branchy"]
    options = ["--model", "masked", "--out", str(target), "-f", "csv"]
    result = CliRunner().invoke(cli, [*args, *options])
    return str(root / "store"), target, (result.exit_code, result.stdout, result.stderr)


def test_export_splits_the_group_at_the_cut(
    exported: tuple[str, Path, tuple[int, str, str]],
) -> None:
    _, _, (code, out, err) = exported
    assert code == 0
    assert out == CSV
    assert (
        "note: g0[batch<=3]: a regime of g0: torch.export cuts its recorded batch into 3 | 4 "
        "(the program it traced refuses the other side: batch = 4 is outside the program's "
        "range [2, 3]); one program per side\n"
    ) in err


def test_summary_shows_the_programs_serving_each_group(
    exported: tuple[str, Path, tuple[int, str, str]],
) -> None:
    store, target, _ = exported
    result = CliRunner().invoke(
        cli, ["--store", store, "summary", "--artifact", str(target), "-f", "json"]
    )
    assert result.exit_code == 0
    (model,) = [m for m in json.loads(result.stdout)["models"] if m["model"] == "masked"]
    assert [(p["group"], p["served_as"], p["program"]) for p in model["programs"]] == [
        ("g0", "g0[batch<=3]", "g0[batch<=3]"),
        ("g0", "g0[batch>=4]", "g0[batch>=4]"),
        ("g1", "g1", "g1"),
    ]
    assert result.stderr == ""


def test_summary_of_a_missing_artifact_is_one_error_line(
    exported: tuple[str, Path, tuple[int, str, str]], tmp_path: Path
) -> None:
    store, _, _ = exported
    result = CliRunner().invoke(
        cli, ["--store", store, "summary", "--artifact", str(tmp_path / "no.pt2")]
    )
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == f"Error: no artifact at {tmp_path / 'no.pt2'}\n"
