"""`capture.engines.profiles`: min / opt / max per input from recorded traffic.

The expected answers are computed here from the traffic the test recorded, by the rule the
module documents, never from the store.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import capture
from capture.engines.profile_formats import format_profiles
from capture.engines.profiles import build_profiles, count_peaks, export_names, target_size
from capture.store_api import Store
from fixtures.names import cache_argument
from fixtures.traffic import record_traffic

# Marginal modes are batch 1 and length 30, but (1, 30) was never sent.
TRAFFIC = [((1, 10), 2), ((1, 20), 2), ((2, 30), 3), ((4, 30), 3)]
# Two peaks of lengths: short chats and long documents.
BIMODAL = [((1, 16), 30), ((1, 20), 40), ((2, 24), 30), ((1, 1500), 50), ((1, 1800), 50)]


def _expected_opt(traffic: list[tuple[tuple[int, int], int]], how: str) -> tuple[int, int]:
    """The documented rule, by brute force over the recorded signatures."""
    sizes = [s for s, _ in traffic]
    targets, spreads = [], []
    for axis in range(2):
        counts: dict[int, int] = {}
        for s, n in traffic:
            counts[s[axis]] = counts.get(s[axis], 0) + n
        values = sorted(counts)
        if how == "mode":
            top = max(counts.values())
            targets.append(min(v for v in values if counts[v] == top))
        else:
            q = {"p50": 0.5, "p90": 0.9}[how]
            total, running = sum(counts.values()), 0
            for v in values:
                running += counts[v]
                if running >= q * total:
                    targets.append(v)
                    break
        spreads.append(values[-1] - values[0])

    def key(item: tuple[tuple[int, int], int]) -> tuple[float, int, tuple[int, int]]:
        s, n = item
        distance = sum(abs(s[a] - targets[a]) / spreads[a] for a in range(2) if spreads[a])
        return (distance, -n, s)

    best = min(traffic, key=key)[0]
    assert best in sizes
    return best


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("pair")
    record_traffic(root, TRAFFIC)
    with capture.open_store(root) as store:
        yield store


@pytest.fixture(scope="module")
def bimodal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    root = tmp_path_factory.mktemp("bimodal")
    record_traffic(root, BIMODAL)
    with capture.open_store(root) as store:
        yield store


def _shapes(store: Store, **options: object) -> dict[tuple[int, str], tuple[list[int], ...]]:
    rows = store.profiles(**options).to_pylist()
    return {
        (r["profile"], r["input"]): (r["min_shape"], r["opt_shape"], r["max_shape"]) for r in rows
    }


@pytest.mark.parametrize("how", ["mode", "p50", "p90"])
def test_opt_is_the_recorded_signature_the_rule_picks(pair: Store, how: str) -> None:
    batch, length = _expected_opt(TRAFFIC, how)
    shapes = _shapes(pair, opt=how)
    assert shapes[(0, "x")][1] == [batch, length, 2]
    assert shapes[(0, "mask")][1] == [batch, length]


def test_mode_opt_is_never_a_mix_of_per_dim_modes(pair: Store) -> None:
    opt = _shapes(pair)[(0, "mask")][1]
    # Per-dim modes would give (1, 30), which production never sent.
    assert opt == [2, 30]
    assert tuple(opt) in {s for s, _ in TRAFFIC}


def test_min_and_max_are_the_recorded_extremes(pair: Store) -> None:
    shapes = _shapes(pair)
    assert (shapes[(0, "x")][0], shapes[(0, "x")][2]) == ([1, 10, 2], [4, 30, 2])


def test_opt_calls_counts_the_calls_with_the_opt_signature(pair: Store) -> None:
    rows = pair.profiles().to_pylist()
    assert {(r["calls"], r["opt_calls"]) for r in rows} == {(10, 3)}


def test_one_profile_by_default_even_with_two_peaks(bimodal: Store) -> None:
    assert {p for p, _ in _shapes(bimodal)} == {0}


def test_two_peaks_give_two_profiles_split_between_them(bimodal: Store) -> None:
    shapes = _shapes(bimodal, max_profiles=3)  # at most 3, but the traffic has 2 peaks
    assert shapes[(0, "mask")] == ([1, 16], [1, 20], [2, 24])
    assert shapes[(1, "mask")] == ([1, 1500], [1, 1500], [1, 1800])


def test_count_peaks_needs_a_deep_valley() -> None:
    assert count_peaks([16, 20, 24, 1500, 1800], [30, 40, 30, 50, 50]) == 2
    assert count_peaks([1, 2, 4, 8], [55, 25, 15, 5]) == 1
    # 2-3 and 8-15 bins are peaks, the 4-7 bin between them holds 60% of the smaller one.
    assert count_peaks([2, 5, 9], [10, 6, 10]) == 1


def test_target_size_quantiles_are_over_calls() -> None:
    assert [target_size([1, 2, 8], [5, 5, 2], how) for how in ("mode", "p50", "p90")] == [1, 2, 8]


def test_unknown_group_is_a_clear_error(pair: Store) -> None:
    with pytest.raises(capture.errors.UnknownModel, match="no call group 'decode'.*--group"):
        pair.profiles(group="decode")


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor, extra: dict[str, list[torch.Tensor]]) -> torch.Tensor:
        return x.sum() + extra["Key-A"][0].sum() + extra["Key-A"][1].sum()


def test_input_names_are_torch_export_placeholder_names(tmp_path: Path) -> None:
    model = Nested()
    calls = [(torch.ones(b, 3), {"Key-A": [torch.ones(b), torch.ones(2, b)]}) for b in (2, 3)]
    with capture.Recorder(model, tmp_path, name="nested"):
        for x, extra in calls:
            model(x, extra)
    with capture.open_store(tmp_path) as store:
        names = store.profiles().column("input").to_pylist()
    program = torch.export.export(model, calls[0])
    placeholders = [
        s.arg.name
        for s in program.graph_signature.input_specs
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    assert names == placeholders == ["x", "extra_key_a_0", "extra_key_a_1"]


def test_export_names_suffix_duplicates() -> None:
    rows = [
        {"leaf": 0, "kind": "tensor", "path": "kwargs['a_b']", "argument": "a_b"},
        {"leaf": 1, "kind": "tensor", "path": "kwargs['a'].b", "argument": "a"},
        {"leaf": 2, "kind": "none", "path": "kwargs['c']", "argument": "c"},
    ]
    assert export_names(rows) == {0: "a_b", 1: "a_b_1"}


def test_trtexec_flags(pair: Store) -> None:
    from capture.analysis.groups import analyze

    text = format_profiles(build_profiles(analyze(pair)), "trtexec")
    assert text.splitlines()[1] == (
        "--minShapes=x:1x10x2,mask:1x10 --optShapes=x:2x30x2,mask:2x30 "
        "--maxShapes=x:4x30x2,mask:4x30"
    )


def test_onnxruntime_options_repeat_names_per_profile(bimodal: Store) -> None:
    from capture.analysis.groups import analyze

    text = format_profiles(build_profiles(analyze(bimodal), max_profiles=2), "onnxruntime")
    options = json.loads(text.splitlines()[1])
    assert options["trt_profile_min_shapes"] == "x:1x16x2,mask:1x16,x:1x1500x2,mask:1x1500"
    assert options["trt_profile_max_shapes"] == "x:2x24x2,mask:2x24,x:1x1800x2,mask:1x1800"


def _trt_inputs(text: str) -> dict[str, list[dict[str, object]]]:
    """Variable -> its ``torch_tensorrt.Input(...)`` calls' keywords, read with `ast`
    (torch_tensorrt is not installable here; the values are literals or ``torch.<dtype>``)."""
    out: dict[str, list[dict[str, object]]] = {}
    for node in ast.parse(text).body:
        if not isinstance(node, ast.Assign):
            continue
        (target,) = node.targets
        assert isinstance(target, ast.Name) and isinstance(node.value, ast.List)
        calls = []
        for call in node.value.elts:
            assert isinstance(call, ast.Call) and ast.unparse(call.func) == "torch_tensorrt.Input"
            assert call.args == []
            keywords: dict[str, object] = {}
            for kw in call.keywords:
                is_dtype = kw.arg == "dtype"
                keywords[str(kw.arg)] = (
                    ast.unparse(kw.value) if is_dtype else ast.literal_eval(kw.value)
                )
            calls.append(keywords)
        out[target.id] = calls
    return out


def _check_documented_form(inputs: list[dict[str, object]]) -> None:
    """Torch-TensorRT's documented ``Input(profiles=[...])`` rules (``torch_tensorrt.Input``
    docstring and the multi-optimization-profile tutorial): ``profiles`` is the only shape
    given, a non-empty list of dicts with exactly min_shape / opt_shape / max_shape tuples of
    one rank, every size >= 1, min <= opt <= max elementwise, and every input of the engine
    declares the same number of profiles."""
    counts = set()
    for keywords in inputs:
        assert set(keywords) <= {"profiles", "dtype", "name"} and "profiles" in keywords
        profiles = keywords["profiles"]
        assert isinstance(profiles, list) and profiles
        counts.add(len(profiles))
        ranks = set()
        for profile in profiles:
            assert set(profile) == {"min_shape", "opt_shape", "max_shape"}
            low, opt, high = profile["min_shape"], profile["opt_shape"], profile["max_shape"]
            assert len(low) == len(opt) == len(high)
            ranks.add(len(low))
            assert all(1 <= a <= b <= c for a, b, c in zip(low, opt, high, strict=False))
        assert len(ranks) == 1
        assert str(keywords.get("dtype", "torch.float32")).startswith("torch.")
    assert len(counts) == 1


def test_torch_tensorrt_inputs_have_the_documented_profiles_form(pair: Store) -> None:
    from capture.analysis.groups import analyze

    text = format_profiles(build_profiles(analyze(pair)), "torch-tensorrt")
    inputs = _trt_inputs(text)
    assert list(inputs) == ["inputs_g0"]
    _check_documented_form(inputs["inputs_g0"])
    mask = next(k for k in inputs["inputs_g0"] if k["name"] == "mask")
    assert mask == {
        "profiles": [{"min_shape": (1, 10), "opt_shape": (2, 30), "max_shape": (4, 30)}],
        "dtype": "torch.float32",
        "name": "mask",
    }


def test_torch_tensorrt_lists_a_group_s_profiles_in_order_on_every_input(
    bimodal: Store,
) -> None:
    from capture.analysis.groups import analyze

    profiles = build_profiles(analyze(bimodal), max_profiles=2)
    inputs = _trt_inputs(format_profiles(profiles, "torch-tensorrt"))["inputs_g0"]
    _check_documented_form(inputs)
    mask = next(k for k in inputs if k["name"] == "mask")
    assert mask["profiles"] == [
        {"min_shape": (1, 16), "opt_shape": (1, 20), "max_shape": (2, 24)},
        {"min_shape": (1, 1500), "opt_shape": (1, 1500), "max_shape": (1, 1800)},
    ]
    # First-fit in index order: every recorded call finds the profile built for its peak.
    for (batch, length), _ in BIMODAL:
        first = next(
            i
            for i, p in enumerate(mask["profiles"])
            if all(
                a <= v <= c
                for a, v, c in zip(p["min_shape"], (batch, length), p["max_shape"], strict=False)
            )
        )
        assert first == (0 if length < 1000 else 1)


def test_torch_tensorrt_profiles_start_at_one_where_zero_was_recorded(tmp_path: Path) -> None:
    from capture.analysis.groups import analyze

    record_traffic(tmp_path, [((0, 4), 2), ((2, 8), 3)])
    with capture.open_store(tmp_path) as store:
        text = format_profiles(build_profiles(analyze(store)), "torch-tensorrt")
    assert "TensorRT takes sizes >= 1" in text
    _check_documented_form(_trt_inputs(text)["inputs_g0"])


def test_llama_fixture_profiles_cover_every_tensor_input(llama: Store) -> None:
    rows = llama.profiles(group="decode").to_pylist()
    by_name = {r["input"]: r for r in rows}
    c = cache_argument()
    assert list(by_name) == [  # the forward signature's order
        "input_ids",
        "attention_mask",
        "position_ids",
        f"{c}_key_cache_0",
        f"{c}_key_cache_1",
        f"{c}_value_cache_0",
        f"{c}_value_cache_1",
    ]
    mask, cache = by_name["attention_mask"], by_name[f"{c}_key_cache_0"]
    # The opt signature keeps the recorded relation mask = cache + 1.
    assert mask["opt_shape"][1] == cache["opt_shape"][2] + 1


def test_llama_prefill_profile_from_the_workload(llama: Store) -> None:
    from fixtures.stores import LLAMA_WORKLOAD

    # Prompts of batch >= 2 carry an attention mask: the `prefill` group.
    prompts = [(b, n) for b, n in LLAMA_WORKLOAD if b >= 2]
    batches = [b for b, _ in prompts]
    lengths = [n for _, n in prompts]
    # Mode per symbol: batch 2 (most prompts), length: all once, so the smallest.
    target = (max(set(batches), key=lambda b: (batches.count(b), -b)), min(lengths))
    assert target in prompts  # so the rule's nearest signature is the target itself
    row = next(r for r in llama.profiles(group="prefill").to_pylist() if r["input"] == "input_ids")
    assert row["min_shape"] == [min(batches), min(lengths)]
    assert row["max_shape"] == [max(batches), max(lengths)]
    assert row["opt_shape"] == list(target)


@pytest.mark.slow
def test_llama_input_names_match_the_exported_program(llama: Store, llama_root: Path) -> None:
    import replay
    from fixtures.models import tiny_llama

    result = replay.export(tiny_llama(0), llama_root, groups=["decode"])
    placeholders = [
        s.arg.name
        for s in result.programs["decode"].graph_signature.input_specs
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    names = llama.profiles(group="decode").column("input").to_pylist()
    # The program's user inputs also hold the scalars (use_cache, ...): ours are its tensors.
    assert names == [p for p in placeholders if p in names]
    assert set(placeholders) - set(names) == {"logits_to_keep", "use_cache", "return_dict"}
