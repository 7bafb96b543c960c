"""capture.compat against the installed torch: every private API it wraps is there and does what
capture relies on. A torch release that moves one fails here, by name."""

from __future__ import annotations

import logging
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import sympy
import torch
import torch.utils._pytree as pytree
from torch.export import Dim

from capture import compat, compat_archive
from capture.compat import versions

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def no_lost_api(caplog: pytest.LogCaptureFixture) -> object:
    """Each test fails when the function it calls finds its private API missing (warned)."""
    caplog.set_level(logging.WARNING, logger="capture.compat")
    versions._warned.clear()
    yield
    lost = [r.getMessage() for r in caplog.records if r.name == "capture.compat"]
    assert lost == []


@dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def _register_pair() -> None:
    pytree.register_pytree_node(
        Pair,
        lambda p: ([p.a, p.b], None),
        lambda children, _: Pair(*children),
        serialized_type_name="tests.test_compat.Pair",
    )


def _release(version: str) -> str:
    return version.split("+")[0]


def test_installed_pair_is_one_ci_tests() -> None:
    # Every test of this file exercises one entry of capture/compat/ on the installed torch:
    # the pairs of compat.TESTED are what .ci/run installs, so CHECKED_ON (derived from them)
    # lists exactly the torch versions these tests passed on. A new pair goes into TESTED.
    transformers = pytest.importorskip("transformers")
    installed = (_release(torch.__version__), _release(transformers.__version__))
    assert installed in compat.TESTED, (
        f"torch {installed[0]} + transformers {installed[1]} is not a pair .ci/run tests "
        f"({compat.TESTED}): add it to capture.compat.TESTED once this suite passes on it"
    )
    assert compat.CHECKED_ON == tuple(t for t, _ in compat.TESTED)


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def _declared_ranges() -> dict[str, set[str]]:
    """Package -> every requirement text pyproject.toml declares for it (dependencies, extras)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    texts = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        texts.extend(extra)
    ranges: dict[str, set[str]] = {}
    for text in texts:
        name = re.split(r"[<>=!~\[ ;]", text, maxsplit=1)[0]
        ranges.setdefault(name, set()).add(text[len(name) :].replace(" ", ""))
    return ranges


def test_pyproject_declares_the_tested_range_and_nothing_else() -> None:
    # Declare what CI tests: from the oldest tested minor release up to the newest one, for torch
    # and (in every extra that names it) transformers.
    ranges = _declared_ranges()
    for index, package in enumerate(("torch", "transformers")):
        oldest = _minor(compat.TESTED[0][index])
        newest = _minor(compat.TESTED[-1][index])
        expected = f">={oldest[0]}.{oldest[1]},<{newest[0]}.{newest[1] + 1}"
        assert ranges[package] == {expected}, f"{package}: {ranges[package]}"


def test_every_function_names_its_private_api() -> None:
    functions = {
        name
        for name in compat.__all__
        if callable(getattr(compat, name)) and not isinstance(getattr(compat, name), type)
    }
    assert functions == set(compat.PRIVATE_APIS)


def test_guards_code_is_what_the_program_checks() -> None:
    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    dim = torch.export.Dim.DYNAMIC
    ep = torch.export.export(Double(), (torch.ones(3),), dynamic_shapes=({0: dim},))
    assert compat.guards_code(ep) == []
    compat.set_guards_code(ep, ["L['x'].size()[0] == 99"])
    assert compat.guards_code(ep) == ["L['x'].size()[0] == 99"]
    with pytest.raises(AssertionError, match="Guard failed"):
        ep.module()(torch.ones(5))


def test_deregister_pytree_node_undoes_a_registration() -> None:
    _register_pair()
    assert Pair in compat.pytree_nodes()
    assert compat.deregister_pytree_node(Pair) is True
    assert Pair not in compat.pytree_nodes()


def test_pytree_nodes_is_torchs_live_registry() -> None:
    nodes = compat.pytree_nodes()
    children, _ = nodes[tuple].flatten_fn((1, 2))
    assert list(children) == [1, 2]
    _register_pair()
    try:
        assert nodes[Pair].flatten_fn(Pair(torch.ones(1), torch.zeros(1)))[0][1].item() == 0
    finally:
        compat.deregister_pytree_node(Pair)


def test_serialized_pytree_types_know_a_registered_class() -> None:
    _register_pair()
    try:
        tables = compat.serialized_pytree_types()
        assert tables is not None
        by_name, serialization = tables
        assert by_name["tests.test_compat.Pair"] is Pair
        assert serialization[Pair].serialized_type_name == "tests.test_compat.Pair"
    finally:
        compat.deregister_pytree_node(Pair)


def test_leaf_treespec_is_torchs_leaf() -> None:
    spec = compat.leaf_treespec()
    assert spec == pytree.tree_flatten(torch.ones(1))[1]


def test_tensor_metadata_check_ignores_sizes_and_checks_dtypes() -> None:
    check = compat.tensor_metadata_check([torch.ones(2, 3), torch.zeros(4, dtype=torch.int64)])
    assert check is not None
    assert check(torch.ones(7, 1), torch.zeros(9, dtype=torch.int64))
    assert not check(torch.ones(7, 1), torch.zeros(9, dtype=torch.int32))
    assert not check(torch.ones(7), torch.zeros(9, dtype=torch.int64))  # another rank


def test_run_outside_dynamo_runs_the_recording_eagerly_under_compile() -> None:
    compiling: list[bool] = []

    def record(x: torch.Tensor) -> torch.Tensor:
        compiling.append(torch.compiler.is_compiling())
        return x + 1

    def entry(x: torch.Tensor) -> torch.Tensor:
        return record(x)

    compat.run_outside_dynamo(entry, (), (record,), "a test")
    assert entry._torchdynamo_disable is True  # type: ignore[attr-defined]

    @torch.compile(backend="eager")
    def caller(x: torch.Tensor) -> torch.Tensor:
        return entry(x * 2) * 3

    assert caller(torch.ones(2)).tolist() == [9.0, 9.0]
    assert compiling == [False]


def test_export_check_tells_an_export_from_a_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    exporting = compat.export_check()

    class Probe(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1 if exporting() else x - 1

    probe, zero = Probe(), torch.zeros(1)
    compiled = torch.compile(probe, backend="eager")
    assert not exporting() and compiled(zero).item() == -1  # torch.compile is no export
    for strict in (True, False):
        program = torch.export.export(probe, (zero,), strict=strict)
        assert program.module()(zero).item() == 1, strict
    # The compiled frame guards on the flag: raised, it is traced again, not reused.
    monkeypatch.setattr(torch.compiler, "_is_exporting_flag", True)
    assert compiled(zero).item() == 1


def test_a_missing_private_api_is_warned_once_with_what_is_lost(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delattr(pytree, "_deregister_pytree_node")
    assert compat.deregister_pytree_node(Pair) is False
    assert compat.deregister_pytree_node(Pair) is False
    lost = [r.getMessage() for r in caplog.records if r.name == "capture.compat"]
    assert len(lost) == 1
    assert "torch.utils._pytree._deregister_pytree_node" in lost[0]
    assert "registered cache classes stay registered" in lost[0]
    caplog.clear()  # seen: the fixture checks that no other test meets a missing API


def test_dim_kind_tells_torch_exports_dim_objects_apart() -> None:
    batch = torch.export.Dim("batch", min=2)
    assert compat.dim_kind(batch) == "dim"
    assert compat.dim_kind(batch + 1) == "derived"
    assert compat.dim_kind(torch.export.Dim.DYNAMIC) == "hint"
    assert compat.dim_kind(torch.export.Dim.AUTO) == "hint"
    assert compat.dim_kind(2) is None


# -- constraint violations and symbolic shapes (replay.pipeline.splitting, replay.pipeline.bounded)
# -----------------
class _Branchy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] > 3 else x + 1


def _violation() -> BaseException:
    with pytest.raises(Exception) as caught:
        torch.export.export(_Branchy(), (torch.ones(2, 3),), dynamic_shapes=({0: Dim("n")},))
    return caught.value


def test_a_constraint_violation_is_told_by_its_type() -> None:
    error = _violation()
    # decided by torch's UserError type, not by its text.
    assert type(error).__name__ == "UserError"
    assert compat.is_constraint_violation(error)


def test_a_typed_error_of_another_kind_is_not_a_violation_whatever_its_text() -> None:
    from torch._dynamo.exc import UserError, UserErrorType

    error = UserError(UserErrorType.DYNAMIC_CONTROL_FLOW, "Constraints violated (x)! but typed")
    assert not compat.is_constraint_violation(error)


def test_violation_names_lists_the_dims_torch_names() -> None:
    assert compat.violation_names(_violation()) == {"n"}


def test_shape_facts_read_the_cut_of_a_program() -> None:
    program = torch.export.export(
        _Branchy(), (torch.ones(2, 3),), dynamic_shapes=({0: Dim.DYNAMIC},)
    )
    facts = compat.shape_facts(program)
    assert facts is not None
    ((rows, cols),) = facts.inputs
    assert isinstance(rows, sympy.Symbol) and cols == 3
    assert facts.ranges[rows] == (2, 3)
    # The guard torch keeps for the branch: false for 4 rows, true for 3.
    assert any(g.xreplace({rows: 4}) is sympy.false for g in facts.guards)
    assert all(g.xreplace({rows: 3}) is sympy.true for g in facts.guards)


def test_shape_facts_of_a_static_program_have_no_symbols() -> None:
    program = torch.export.export(_Branchy(), (torch.ones(2, 3),))
    assert compat.shape_facts(program) == compat.ShapeFacts(((2, 3),), {}, ())


# -- the artifact (replay.runtime): PT2 archive layout, program JSON, AOTInductor ----------------


class _Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * 2


def _program() -> tuple[_Affine, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    model = _Affine()
    dims = ({0: torch.export.Dim.DYNAMIC},)
    return model, torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=dims)


def test_every_archive_function_names_its_private_api() -> None:
    functions = {n for n in compat_archive.__all__ if callable(getattr(compat_archive, n))}
    assert functions == set(compat_archive.PRIVATE_APIS)
    assert compat_archive.CHECKED_ON is compat.CHECKED_ON


def test_the_archive_layout_is_torchs() -> None:
    from torch.export.pt2_archive import constants as c

    from replay.runtime.pt2 import archive as a

    assert (a.ARCHIVE_FORMAT, a.ARCHIVE_VERSION) == (c.ARCHIVE_FORMAT_PATH, c.ARCHIVE_VERSION_PATH)
    assert (a.MODELS, a.SAMPLE_INPUTS) == (
        c.MODELS_FILENAME_FORMAT,
        c.SAMPLE_INPUTS_FILENAME_FORMAT,
    )
    assert (a.WEIGHTS_DIR, a.CONSTANTS_DIR) == (c.WEIGHTS_DIR, c.CONSTANTS_DIR)
    assert a.WEIGHTS_CONFIG == c.WEIGHTS_CONFIG_FILENAME_FORMAT
    assert a.CONSTANTS_CONFIG == c.CONSTANTS_CONFIG_FILENAME_FORMAT
    assert (a.WEIGHT_PREFIX, a.CONSTANT_PREFIX) == (
        c.WEIGHT_FILENAME_PREFIX,
        c.TENSOR_CONSTANT_FILENAME_PREFIX,
    )
    assert (a.AOTI_DIR, a.MANIFEST.rpartition("/")[0] + "/") == (c.AOTINDUCTOR_DIR, c.EXTRA_DIR)


def test_the_serialized_dtypes_and_layout_are_torchs() -> None:
    from torch._export.serde import schema
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    from replay.runtime.pt2.records import DTYPES, STRIDED

    torchs = {
        int(code): (str(dtype).removeprefix("torch."), dtype.itemsize)
        for code, dtype in _SERIALIZE_TO_TORCH_DTYPE.items()
    }
    # Every code this torch writes is read as the same dtype; the codes newer releases added
    # (float8_e8m0fnu, uint32, uint64 since 2.13) are known beside them.
    assert {code: DTYPES[code] for code in torchs} == torchs
    assert set(DTYPES) - set(torchs) <= {33, 34, 35}
    assert STRIDED == schema.Layout.Strided.value


def test_a_program_round_trips_around_tensors_the_caller_holds() -> None:
    model, program = _program()
    data = compat_archive.serialize_program(program)
    assert b"example_inputs" not in data and data.startswith(b"{")
    state = {k: torch.nn.Parameter(v.detach().clone()) for k, v in program.state_dict.items()}
    loaded = compat_archive.deserialize_program(data, state, {})
    module = loaded.module()
    assert module.proj.weight.data_ptr() == state["proj.weight"].data_ptr()  # not copied
    x = torch.randn(5, 4)
    torch.testing.assert_close(module(x), model(x))


def test_a_storage_is_written_as_one_archive_record(tmp_path: Path) -> None:
    from torch.export.pt2_archive import PT2ArchiveWriter

    tensor = torch.arange(16, dtype=torch.float32)
    with PT2ArchiveWriter(str(tmp_path / "x.pt2")) as writer:
        compat_archive.write_archive_storage(
            writer, "data/weights/weight_0", tensor.untyped_storage()
        )
    with zipfile.ZipFile(tmp_path / "x.pt2") as z:
        info = z.getinfo("x/data/weights/weight_0")
        assert (info.compress_type, z.read(info)) == (zipfile.ZIP_STORED, tensor.numpy().tobytes())


@pytest.mark.slow
def test_aoti_builds_without_weights_and_runs_on_the_callers_tensors(tmp_path: Path) -> None:
    from torch.export.pt2_archive import PT2ArchiveWriter

    model, program = _program()
    files = compat_archive.aoti_compile(program.module(), (torch.randn(3, 4),), {})
    with PT2ArchiveWriter(str(tmp_path / "a.pt2")) as writer:
        for file in files:
            writer.write_file(f"data/aotinductor/g0/{os.path.basename(file)}", file)
    compiled = compat_archive.aoti_load(str(tmp_path / "a.pt2"), "g0")
    # the constants the build reads at run time (AOTInductor folds some, here the bias, into
    # its code: those are compiled in, not handed over)
    names = compiled.get_constant_fqns()
    assert "proj.weight" in names
    weight, bias = model.proj.weight.detach().clone(), model.proj.bias.detach()
    tensors = {"proj.weight": weight, "proj.bias": bias}
    compiled.load_constants(
        {n: tensors[n] for n in names}, check_full_update=True, user_managed=True
    )
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
        weight.mul_(3)  # user_managed: the build reads this very storage, no copy of its own
        torch.testing.assert_close(compiled(x), (x @ weight.T + bias) * 2)


def test_mark_unbacked_marks_the_axis_within_its_range_where_torch_takes_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import inspect

    from torch._dynamo.decorators import mark_unbacked

    t = torch.ones(3, 4)
    bounded = "min" in inspect.signature(mark_unbacked).parameters
    with caplog.at_level("WARNING", logger="capture.compat"):
        compat.mark_unbacked(t, 0, {"min": 2, "max": 8})
    assert 0 in t._dynamo_unbacked_indices  # type: ignore[attr-defined]
    # torch 2.11/2.12 take no range: marked without it, and said once.
    lost = [r for r in caplog.records if "mark_unbacked" in r.getMessage()]
    assert len(lost) == (0 if bounded else 1)
    caplog.clear()  # the one expected warning of a torch without the range
