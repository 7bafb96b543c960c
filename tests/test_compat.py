"""capture.compat against the installed torch: each private API it wraps still says what we read.

A torch release that moves one of them fails here, by name, rather than deep in an export.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest
import sympy
import torch
from torch.export import Dim

from capture import compat


class _Branchy(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[0] > 3 else x + 1


def _violation() -> BaseException:
    with pytest.raises(Exception) as caught:
        torch.export.export(_Branchy(), (torch.ones(2, 3),), dynamic_shapes=({0: Dim("n")},))
    return caught.value


def test_a_constraint_violation_is_told_by_its_type() -> None:
    error = _violation()
    # issue 23 item 3: decided by torch's UserError type, not by its text.
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


# -- the artifact (replay.ship): PT2 archive layout, program JSON, AOTInductor (issue 20) -----


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


def test_the_archive_layout_is_torchs() -> None:
    from torch.export.pt2_archive import constants as c

    from replay.ship import archive as a

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

    from replay.ship.records import DTYPES, STRIDED

    assert {code: name for code, (name, _) in DTYPES.items()} == {
        int(code): str(dtype).removeprefix("torch.")
        for code, dtype in _SERIALIZE_TO_TORCH_DTYPE.items()
    }
    assert {code: size for code, (_, size) in DTYPES.items()} == {
        int(code): dtype.itemsize for code, dtype in _SERIALIZE_TO_TORCH_DTYPE.items()
    }
    assert STRIDED == schema.Layout.Strided.value


def test_a_program_round_trips_around_tensors_the_caller_holds() -> None:
    model, program = _program()
    data = compat.serialize_program(program)
    assert b"example_inputs" not in data and data.startswith(b"{")
    state = {k: torch.nn.Parameter(v.detach().clone()) for k, v in program.state_dict.items()}
    loaded = compat.deserialize_program(data, state, {})
    module = loaded.module()
    assert module.proj.weight.data_ptr() == state["proj.weight"].data_ptr()  # not copied
    x = torch.randn(5, 4)
    torch.testing.assert_close(module(x), model(x))


def test_a_storage_is_written_as_one_archive_record(tmp_path: Path) -> None:
    from torch.export.pt2_archive import PT2ArchiveWriter

    tensor = torch.arange(16, dtype=torch.float32)
    with PT2ArchiveWriter(str(tmp_path / "x.pt2")) as writer:
        compat.write_archive_storage(writer, "data/weights/weight_0", tensor.untyped_storage())
    with zipfile.ZipFile(tmp_path / "x.pt2") as z:
        info = z.getinfo("x/data/weights/weight_0")
        assert (info.compress_type, z.read(info)) == (zipfile.ZIP_STORED, tensor.numpy().tobytes())


@pytest.mark.slow
def test_aoti_builds_without_weights_and_runs_on_the_callers_tensors(tmp_path: Path) -> None:
    from torch.export.pt2_archive import PT2ArchiveWriter

    model, program = _program()
    files = compat.aoti_compile(program.module(), (torch.randn(3, 4),), {})
    with PT2ArchiveWriter(str(tmp_path / "a.pt2")) as writer:
        for file in files:
            writer.write_file(f"data/aotinductor/g0/{os.path.basename(file)}", file)
    compiled = compat.aoti_load(str(tmp_path / "a.pt2"), "g0")
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
