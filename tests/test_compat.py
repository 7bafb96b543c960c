"""capture.compat against the installed torch: each private API it wraps still says what we read.

A torch release that moves one of them fails here, by name, rather than deep in an export.
"""

from __future__ import annotations

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
