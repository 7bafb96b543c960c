"""The one matching rule of an artifact: the program that serves a call (`route`), and why each
program tried before it did not.

Needs neither torch nor the model's code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from replay.runtime.guards.leaves import STRUCTURE_DIFFERS, LeafFacts, structure_difference
from replay.runtime.guards.program_guard import ProgramGuard

__all__ = ["CallFacts", "route"]


CallFacts = tuple[str | None, Sequence[LeafFacts], Sequence[int]]
"""What routing compares of a call: its treespec, its leaves, its input sizes."""


def route(
    guards: Iterable[ProgramGuard],
    facts: Callable[[ProgramGuard], CallFacts],
    distances: dict[str, int] | None = None,
) -> tuple[ProgramGuard | None, dict[str, str]]:
    """The program that serves a call, tried in order, and why each one before it did not.

    The one matching rule of an artifact: the runner (`replay.runtime.runner.Runner`) routes live
    calls with it, ``capture check`` (`replay.check.drift`) recorded signatures, so a signature
    reported served is one the runner serves.

    Args:
        guards: The programs' guards, in the order they are tried.
        facts: A program's guard -> the call's treespec, leaves and sizes as that program
            sees them (the runner describes a live call with the program's recorded
            signature; a recorded call has one description for every program).
        distances: Filled, when given, with group label -> how many inputs of the call differ
            from the program's recorded structure (0: the structure matched, a guard failed),
            for naming the group that came closest.

    Returns:
        ``(guard, {})``: the first guard whose structure matches and whose checks pass; or
        ``(None, reasons)`` when none does: group label -> why each program refused.

    Example:
        >>> from replay.runtime.guards import Axis, ProgramGuard
        >>> guard = ProgramGuard("", "g0", "g0", None, (), (Axis("args[0]", 0, 2, 4, True),))
        >>> route([guard], lambda g: (None, (), [9]))[1]
        {'g0': 'args[0] axis 0 = 9 is outside the recorded range [2, 4]'}
    """
    # A served call pays for no explanation: what differs between structures (the costly part,
    # a walk over both leaf lists) is described only once no program accepts the call.
    refused: list[tuple[ProgramGuard, CallFacts, str | None]] = []
    for guard in guards:
        call = facts(guard)
        treespec, leaves, dims = call
        if not guard.matches(treespec, leaves):
            refused.append((guard, call, None))
            continue
        failed = guard.check(dims)
        if failed is None:
            return guard, {}
        refused.append((guard, call, failed))
    reasons: dict[str, str] = {}
    for guard, (treespec, leaves, _dims), failed in refused:
        differing = 0  # inputs that differ from the recorded structure; 0: a guard failed
        if failed is None:
            count, what = structure_difference(guard.treespec, guard.leaves, treespec, leaves)
            failed = f"{STRUCTURE_DIFFERS}: {what}" if what else STRUCTURE_DIFFERS
            differing = max(count, 1)
        reasons[guard.label] = failed
        if distances is not None:
            distances[guard.label] = differing
    return None, reasons
