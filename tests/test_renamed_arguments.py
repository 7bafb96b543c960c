"""An argument a library renamed is one argument: a store recorded across the rename.

transformers 5.24 renamed ``forward``'s ``past_key_values`` to ``cache`` and still accepts the
old name: a fleet upgrading from 5.23 records the same argument under both names into one store.
Here one real tiny Llama is recorded twice, half its traffic passing the cache as
``past_key_values`` (5.23's spelling) and half as ``cache``, into one store, and the whole traffic
under ``cache`` into another: the groups, dims and symbols must be the same, and the exported
program must serve the original calls of both halves (forward pre-hook copies).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import capture
import replay
from capture.analysis.groups import Group, analyze
from capture.cli.main import cli
from capture.record.call_structure import describe
from capture.signature import Signature
from capture.store_api import open_store
from fixtures.names import cache_argument
from replay.runtime.coverage import CoverageRow

# transformers 5.24 warns once per process that the old name is deprecated: here it is passed
# on purpose, as a 5.23 caller does.
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")

needs_both = pytest.mark.skipif(
    cache_argument() != "cache",
    reason="transformers before 5.24 takes its cache as past_key_values only: one spelling",
)

OLD, NEW = "past_key_values", "cache"
FIRST = [(2, 4), (3, 5)]  # (batch, prompt length), before the upgrade
SECOND = [(2, 4), (3, 6)]  # after it: (2, 4) is recorded under both spellings


def _model() -> Any:
    from fixtures.generate_traffic import tiny_causal

    return tiny_causal("llama")


def _traffic(model: Any, spelling: str, batches: list[tuple[int, int]]) -> None:
    """A prefill and two decode steps per batch, the cache passed as `spelling`."""
    with torch.no_grad():
        for b, n in batches:
            ids = torch.randint(3, 100, (b, n), generator=torch.Generator().manual_seed(b * n))
            mask = torch.ones(b, n, dtype=torch.long)
            cache = None
            for _ in range(3):
                out = model(input_ids=ids, attention_mask=mask, **{spelling: cache}, use_cache=True)
                cache = out.cache
                ids = out.logits[:, -1:].argmax(-1)
                mask = torch.cat([mask, torch.ones(b, 1, dtype=torch.long)], dim=1)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any, list[Any]]:
    root = tmp_path_factory.mktemp("renamed")
    model = _model()
    originals: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def keep(_: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        originals.append(copy.deepcopy((args, kwargs)))

    with capture.Recorder(model, root / "mixed"):
        handle = model.register_forward_pre_hook(keep, with_kwargs=True)
        _traffic(model, OLD, FIRST)
        _traffic(model, NEW, SECOND)
        handle.remove()
    with capture.Recorder(model, root / "single"):
        _traffic(model, NEW, FIRST + SECOND)
    return root / "mixed", root / "single", model, originals


def _spelled(key: str, spelling: str) -> str:
    return spelling if key in (OLD, NEW) else key


def _groups(path: Path) -> list[Group]:
    with open_store(path) as store:
        return analyze(store)


def _shape(groups: list[Group]) -> list[Any]:
    return [
        (
            g.name,
            g.calls,
            g.signatures,
            [
                (d.path, d.axis, d.dynamic, d.min, d.max, d.distinct, d.symbol, d.expr)
                for d in g.dims
            ],
            [str(r) for r in g.relations],
        )
        for g in groups
    ]


@needs_both
def test_both_spellings_are_recorded_as_passed(recorded: tuple[Path, Path, Any, list[Any]]) -> None:
    mixed, _, _, _ = recorded
    with open_store(mixed) as store:
        rows = store.query(
            "SELECT DISTINCT argument, kind FROM structures WHERE argument IN ($old, $new) "
            "ORDER BY ALL",
            {"old": OLD, "new": NEW},
        ).to_pylist()
    # What the calls passed, no `cache` missing where `past_key_values` was passed.
    assert [(r["argument"], r["kind"]) for r in rows] == [
        (NEW, "none"),
        (NEW, "tensor"),
        (OLD, "none"),
        (OLD, "tensor"),
    ]


@needs_both
def test_a_store_spanning_the_rename_has_the_groups_and_symbols_of_one_spelling(
    recorded: tuple[Path, Path, Any, list[Any]],
) -> None:
    mixed, single, _, _ = recorded
    groups = _groups(mixed)
    assert _shape(groups) == _shape(_groups(single))
    assert [(g.name, len(g.structure_ids)) for g in groups] == [("decode", 2), ("prefill", 2)]
    decode = groups[0]
    # Named after the spelling recorded last (the serving transformers'): one cache symbol.
    cache_dims = [d for d in decode.dims if d.path.startswith(f"kwargs['{NEW}']")]
    assert {d.symbol for d in cache_dims if d.dynamic} == {
        "batch",
        f"{NEW}_2",
    }
    assert not any(OLD in (d.argument or "") for g in groups for d in g.dims)
    # (2, 4) was recorded under both spellings: one signature, its calls added up.
    assert decode.calls == 2 * (len(FIRST) + len(SECOND))


@needs_both
def test_the_export_serves_the_original_calls_of_both_spellings(
    recorded: tuple[Path, Path, Any, list[Any]], tmp_path: Path
) -> None:
    mixed, _, model, originals = recorded
    result = replay.export(model, mixed, probes=0)
    rows = CoverageRow.from_table(result.coverage)
    assert rows and all(r.covered for r in rows), [r for r in rows if not r.covered]
    result.save(tmp_path / "llama.pt2")
    runner = replay.load(tmp_path / "llama.pt2")
    spellings = set()
    with torch.no_grad():
        for args, kwargs in originals:
            spellings |= kwargs.keys() & {OLD, NEW}
            expected = model(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            # The call as recorded, and as a caller on the other transformers spells it.
            for spelling in (OLD, NEW):
                call = {_spelled(k, spelling): v for k, v in copy.deepcopy(kwargs).items()}
                assert runner.select(*args, **call) in ("decode", "prefill")
                got = runner(*copy.deepcopy(args), **call)
                torch.testing.assert_close(got.logits, expected.logits)
    assert spellings == {OLD, NEW}
    # capture check answers as the runner does: every recorded call of both spellings served.
    out = CliRunner().invoke(
        cli, ["--store", str(mixed), "check", str(tmp_path / "llama.pt2"), "-f", "json"]
    )
    assert out.exit_code == 0, out.output
    checked = json.loads(out.stdout)
    assert sum(r["calls"] for r in checked) == len(originals)
    assert all(r["served"] for r in checked)
    assert len(originals) == 3 * (len(FIRST) + len(SECOND))


def test_a_call_passing_the_old_name_misses_no_parameter() -> None:
    def forward(input_ids: Any, cache: Any = None, **kwargs: Any) -> None: ...

    ids = torch.ones(1, 2, dtype=torch.long)
    old = describe(((ids,), {OLD: None}), [ids], signature=Signature.of(forward))
    new = describe(((ids,), {NEW: None}), [ids], signature=Signature.of(forward))
    assert [(leaf.argument, leaf.kind) for leaf in old.leaves] == [
        ("input_ids", "tensor"),
        (OLD, "none"),
    ]
    assert [(leaf.argument, leaf.kind) for leaf in new.leaves] == [
        ("input_ids", "tensor"),
        (NEW, "none"),
    ]


class Renamed(torch.nn.Module):
    """Takes its cache as ``cache`` and still accepts ``past_key_values``, as transformers 5.24's
    models do (its ``deprecate_kwarg`` moves the old keyword to the new parameter)."""

    def forward(self, x: torch.Tensor, cache: Any = None, **kwargs: Any) -> torch.Tensor:
        cache = kwargs.pop("past_key_values", cache)
        return x * 2 if cache is None else x + cache.sum(dim=-1, keepdim=True)


def _renamed_traffic(model: Renamed, spellings: list[str], sizes: list[tuple[int, int]]) -> None:
    for spelling in spellings:
        for b, n in sizes:
            model(torch.ones(b, 3))  # prefill: no cache passed
            model(torch.ones(b, 3), **{spelling: torch.ones(b, n)})


def test_one_group_per_spelled_argument_on_any_transformers(tmp_path: Path) -> None:
    model = Renamed()
    sizes = [(1, 4), (2, 5), (3, 7), (2, 9)]
    with capture.Recorder(model, tmp_path / "mixed", name="m"):
        _renamed_traffic(model, [OLD, NEW], sizes)
    with capture.Recorder(model, tmp_path / "single", name="m"):
        _renamed_traffic(model, [NEW, NEW], sizes)
    groups = _groups(tmp_path / "mixed")
    assert _shape(groups) == _shape(_groups(tmp_path / "single"))
    assert [(g.name, g.calls, g.signatures, len(g.structure_ids)) for g in groups] == [
        ("prefill", 8, 3, 1),
        ("decode", 8, 4, 2),
    ]


def test_structures_differing_in_their_treespec_stay_two() -> None:
    # A sliding window's state (full or filling) lives in the cache's treespec context, not in
    # its leaves: merging such structures made the runner refuse a Mistral's decode calls.
    from capture.renames import spelling_key

    def rows(name: str, state: str) -> list[dict[str, Any]]:
        context = json.dumps([["DynamicSlidingWindowLayer", 6, state]])
        spec = json.dumps(
            [
                1,
                {
                    "type": "builtins.dict",
                    "context": json.dumps([name]),
                    "children_spec": [
                        {
                            "type": "transformers.cache_utils.DynamicCache",
                            "context": context,
                            "children_spec": [],
                        }
                    ],
                },
            ]
        )
        leaf = {"path": f"kwargs['{name}']", "argument": name, "kind": "tensor", "rank": 4}
        return [{**leaf, "treespec": spec}]

    assert spelling_key(rows("past_key_values", "full")) == spelling_key(rows("cache", "full"))
    assert spelling_key(rows("cache", "full")) != spelling_key(rows("cache", "filling"))
