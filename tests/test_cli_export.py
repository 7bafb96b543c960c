"""`capture export MODULE:FACTORY`: real stores, real factories, real torch.export.

Each test checks the exit status, stdout and stderr separately. The factories live in a Python
file written to tmp_path (``factories.py:add``) or in an importable module (``fixtures.seeds``).
"""

from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture.cli.main import cli
from fixtures.stores import record_seed_scenarios
from replay.runtime.pt2.loading import read_manifest

FACTORIES = textwrap.dedent(
    """
    import torch
    from fixtures.seeds import AddModel, MaskedModel


    def add():
        return AddModel()


    def masked():
        return MaskedModel()


    class Renamed(torch.nn.Module):
        def forward(self, x, z):
            return x + z


    def renamed():
        return Renamed()


    class Branchy(torch.nn.Module):
        def forward(self, x, mask=None):
            return x * 2 if x.shape[0] > 3 else x + 1


    def branchy():
        return Branchy()


    def broken():
        raise RuntimeError("no weights here")


    def not_a_model():
        return 42
    """
)

ADD_TABLE = """\
group  kind      signature    calls  covered  max_abs_diff  error  target  sizes
-----  --------  -----------  -----  -------  ------------  -----  ------  ------------
g0     recorded  x=2x6 y=2x6      1  true              0.0  null   torch   [2, 6, 2, 6]
g0     recorded  x=3x7 y=3x7      1  true              0.0  null   torch   [3, 7, 3, 7]
g0     recorded  x=4x8 y=4x8      1  true              0.0  null   torch   [4, 8, 4, 8]
g0     probe     x=3x6 y=3x6      0  true              0.0  null   torch   [3, 6, 3, 6]
g0     probe     x=2x7 y=2x7      0  true              0.0  null   torch   [2, 7, 2, 7]
g0     probe     x=4x6 y=4x6      0  true              0.0  null   torch   [4, 6, 4, 6]
g0     probe     x=2x8 y=2x8      0  true              0.0  null   torch   [2, 8, 2, 8]
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("store")
    record_seed_scenarios(root, names=["add", "masked"])
    return str(root)


@pytest.fixture
def factories(tmp_path: Path) -> str:
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    return str(path)


def _run(store: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", store, "export", *args])
    return result.exit_code, result.stdout, result.stderr


def test_export_prints_the_coverage_per_group_then_a_total_line(store: str, factories: str) -> None:
    # one row per group (covered/total, worst difference in 3 significant digits),
    # and the "N of M covered" total line that capture check and the demo print.
    code, out, err = _run(store, f"{factories}:add", "--model", "add")
    assert code == 0
    assert out == (
        "group  signatures  calls  probes  worst diff  error\n"
        "-----  ----------  -----  ------  ----------  -----\n"
        "g0     3/3         3/3    4/4     0\n"
    )
    assert err == (
        "note: g0: example: the recorded signature x=2x6 y=2x6 (1 call)\n"
        "3 of 3 recorded signatures covered (3 of 3 calls), 4 of 4 probes covered, "
        "max abs diff 0\n"
    )


def test_signatures_prints_the_full_coverage_table(store: str, factories: str) -> None:
    code, out, _ = _run(store, f"{factories}:add", "--model", "add", "--signatures")
    assert (code, out) == (0, ADD_TABLE)


def test_signatures_is_for_the_table_format(store: str, factories: str) -> None:
    code, out, err = _run(store, f"{factories}:add", "--model", "add", "--signatures", "-f", "csv")
    assert (code, out) == (2, "")
    assert "--signatures applies to the table format; -f csv always has one row per" in err


def test_json_format(store: str, factories: str) -> None:
    code, out, _ = _run(store, f"{factories}:add", "--model", "add", "-f", "jsonl")
    assert code == 0
    assert out.splitlines()[0] == (
        '{"group": "g0", "kind": "recorded", "signature": "x=2x6 y=2x6", "calls": 1, '
        '"covered": true, "max_abs_diff": 0.0, "error": null, "target": "torch", '
        '"sizes": [2, 6, 2, 6]}'
    )


def test_a_module_name_works_as_factory(store: str) -> None:
    code, out, _ = _run(store, "fixtures.seeds:AddModel", "--model", "add", "--signatures")
    assert (code, out) == (0, ADD_TABLE)


def test_out_writes_one_artifact_with_every_group(
    store: str, factories: str, tmp_path: Path
) -> None:
    target = tmp_path / "masked.pt2"
    code, _, err = _run(store, f"{factories}:masked", "--model", "masked", "--out", str(target))
    assert code == 0
    # one archive holding both groups' programs, not one file per group
    assert sorted(p.name for p in tmp_path.glob("*.pt2")) == ["masked.pt2"]
    assert [p.group for p in read_manifest(target).programs] == ["g0", "g1"]
    assert f"wrote {target}\n" in err


def test_partial_coverage_exits_3(store: str, factories: str, tmp_path: Path) -> None:
    # masked's g0 has batches 3 and 4: the program exported at 3 guards x.shape[0] <= 3, and
    # --max-regimes 1 keeps g0 whole (not split at the cut), --max-static 0 gives the refused
    # signature no static program.
    target = tmp_path / "branchy.pt2"
    code, out, err = _run(
        store,
        f"{factories}:branchy",
        "--model",
        "masked",
        "--out",
        str(target),
        "--max-regimes",
        "1",
        "--max-static",
        "0",
        "--signatures",
    )
    assert code == 3
    rule = "-" * 62
    assert out.splitlines() == [
        "group  kind      signature         calls  covered  max_abs_diff  error"
        f"{' ' * 59}target  sizes",
        f"-----  --------  ----------------  -----  -------  ------------  {rule}  ------"
        "  --------------",
        "g0     recorded  x=3x10 mask=3x10      1  true              0.0  null"
        f"{' ' * 60}torch   [3, 10, 3, 10]",
        "g0     recorded  x=4x10 mask=4x10      1  false            null  "
        "program failed: AssertionError: Guard failed: x.size()[0] <= 3  torch   [4, 10, 4, 10]",
        "g1     recorded  x=2x10                1  true              0.0  null"
        f"{' ' * 60}torch   [2, 10]",
    ]
    assert err.endswith(
        "export incomplete: 2 of 3 recorded signatures covered (2 of 3 calls), "
        "max abs diff 0 (see the error column)\n"
    )
    # The programs that exported are still written; the artifact refuses the failed signature.
    assert sorted(p.name for p in tmp_path.glob("*.pt2")) == ["branchy.pt2"]
    g0 = read_manifest(target).programs[0].guard
    assert list(g0.rejected.values()) == [
        "program failed: AssertionError: Guard failed: x.size()[0] <= 3"
    ]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nosuch_module_xyz:add", "Error: cannot import nosuch_module_xyz: ModuleNotFoundError: "),
        ("{factories}:nothing", "has no callable 'nothing'"),
        ("{factories}:broken", "broken() failed: RuntimeError: no weights here"),
        (
            "{factories}:not_a_model",
            "not_a_model() returned an object of type int, not a torch.nn.Module",
        ),
        ("missing.py:add", "Error: cannot import missing.py: no such file"),
    ],
)
def test_a_factory_that_cannot_give_a_model(
    store: str, factories: str, tmp_path: Path, target: str, message: str
) -> None:
    out_file = tmp_path / "never.pt2"
    code, out, err = _run(
        store, target.format(factories=factories), "--model", "add", "--out", str(out_file)
    )
    assert (code, out) == (1, "")
    assert message in err
    assert not out_file.exists()


def test_a_forward_signature_that_no_longer_matches(
    store: str, factories: str, tmp_path: Path
) -> None:
    out_file = tmp_path / "never.pt2"
    code, out, err = _run(store, f"{factories}:renamed", "--model", "add", "--out", str(out_file))
    assert (code, out) == (1, "")
    assert err == (
        "Error: model.forward no longer matches the recordings: args[1] was recorded as "
        "parameter 'y', forward now names it 'z' (group g0 of model add)\n"
    )
    assert list(tmp_path.glob("*.pt2")) == []


def test_an_unknown_model(store: str, factories: str) -> None:
    code, out, err = _run(store, f"{factories}:add", "--model", "nope")
    assert (code, out) == (1, "")
    assert err.startswith("Error: no model 'nope' in the store at ")


def test_an_empty_store(tmp_path: Path, factories: str) -> None:
    (tmp_path / "empty").mkdir()
    code, out, err = _run(str(tmp_path / "empty"), f"{factories}:add")
    assert (code, out) == (1, "")
    assert err.startswith("Error: the store at ")
    assert "holds no recorded call yet" in err


def test_no_store(tmp_path: Path, factories: str) -> None:
    code, out, err = _run(str(tmp_path / "nowhere"), f"{factories}:add")
    assert (code, out) == (1, "")
    assert err.startswith(f"Error: no store at {tmp_path / 'nowhere'}")


def test_out_must_be_pt2_or_onnx(store: str, factories: str) -> None:
    code, out, err = _run(store, f"{factories}:add", "--out", "model.bin")
    assert (code, out) == (2, "")
    assert "'model.bin' must end with .pt2 or .onnx" in err


def test_target_must_name_a_factory(store: str) -> None:
    code, _, err = _run(store, "fixtures.seeds")
    assert code == 2
    assert "is not MODULE:FACTORY" in err


@pytest.mark.skipif(importlib.util.find_spec("onnxscript") is not None, reason="onnx installed")
def test_onnx_needs_the_extra(store: str, factories: str, tmp_path: Path) -> None:
    code, out, err = _run(store, f"{factories}:add", "--out", str(tmp_path / "m.onnx"))
    assert (code, out) == (1, "")
    assert err == (
        "Error: ONNX export needs onnx and onnxscript, which are not installed; "
        "run `pip install capture[onnx]`\n"
    )
    assert list(tmp_path.glob("*.onnx")) == []


def test_help_states_the_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["export", "--help"])
    assert result.exit_code == 0
    assert "Exit status: 0 every recorded signature is covered (and every probe); 3 the" in (
        " ".join(result.stdout.split())
    )
