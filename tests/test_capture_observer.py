"""capture.InputObserver: the seeds' results, the mismatch errors, and the store it writes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import capture
from capture import InputObserver, make_dynamic_cache, string_type
from capture.errors import CaptureError, ObservationMismatch
from fixtures.names import cache_argument
from fixtures.seeds import Scenario, scenarios

D = torch.export.Dim.DYNAMIC


def _scenario(name: str) -> Scenario:
    return next(s for s in scenarios() if s.name == name)


def _observe(scenario: Scenario, **options: Any) -> InputObserver:
    observer = InputObserver(value_if_missing=scenario.value_if_missing)
    with observer(scenario.model, **options):
        for args, kwargs in scenario.calls:
            scenario.model(*args, **kwargs)
    return observer


def _cache(seq: int, layers: int = 2, batch: int = 1) -> Any:
    return make_dynamic_cache(
        [(torch.rand(batch, 2, seq, 4), torch.rand(batch, 2, seq, 4)) for _ in range(layers)]
    )


class Toy(torch.nn.Module):
    def forward(
        self, x: torch.Tensor, ys: Any = None, n: int = 1, flag: bool | None = None
    ) -> torch.Tensor:
        return x


def _toy(*calls: tuple[tuple[Any, ...], dict[str, Any]], **options: Any) -> InputObserver:
    model, observer = Toy(), InputObserver(**options)
    with observer(model):
        for args, kwargs in calls:
            model(*args, **kwargs)
    return observer


# -- the seeds ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "set_batch", "dynamic_shapes", "arguments"),
    [
        ("add", None, ({0: D, 1: D}, {0: D, 1: D}), "(T1s2x6,T1s2x6)"),
        ("add_broadcast", None, ({0: D, 1: D}, {1: D}), "(T1s2x6,T1s1x6)"),
        ("linear", None, {"x": {0: D}, "labels": {0: D}}, "dict(x:T1s2x8,labels:T7s2)"),
        ("masked", None, {"x": {0: D}, "mask": {0: D}}, "dict(x:T1s2x10,mask:T1s0x10)"),
        (
            "llm",
            True,
            {
                "input_ids": {0: D, 1: D},
                "attention_mask": {0: D, 1: D},
                "past_key_values": [{0: D, 2: D}] * 4,
            },
            "dict(input_ids:T7s1x10,attention_mask:T7s1x10,past_key_values:DynamicCache("
            "key_cache=#2[T1s1x4x10x32,T1s1x4x10x32], value_cache=#2[T1s1x4x10x32,T1s1x4x10x32]))",
        ),
        (
            "multimodal",
            True,
            {
                "input_ids": {0: D, 1: D},
                "pixel_values": {0: D},
                "attention_mask": {0: D, 1: D},
                "past_key_values": [{0: D, 2: D}] * 4,
            },
            "dict(input_ids:T7s1x1,pixel_values:T1s0x3x224x224,attention_mask:T7s1x21,"
            "past_key_values:DynamicCache(key_cache=#2[T1s1x4x20x32,T1s1x4x20x32], "
            "value_cache=#2[T1s1x4x20x32,T1s1x4x20x32]))",
        ),
    ],
)
def test_seed_scenario(name: str, set_batch: Any, dynamic_shapes: Any, arguments: str) -> None:
    observer = _observe(_scenario(name))
    assert observer.num_obs() == len(_scenario(name).calls)
    ds = observer.infer_dynamic_shapes(set_batch_dimension_for=set_batch)
    assert ds == dynamic_shapes
    assert type(ds) is type(dynamic_shapes)  # a tuple for positional calls, a dict for keywords
    assert string_type(observer.infer_arguments(), with_shape=True) == arguments


def test_dynamic_shapes_print_as_in_seed_000() -> None:
    ds = _observe(_scenario("add")).infer_dynamic_shapes()
    assert str(ds) == (
        "({0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)})"
    )


def test_positional_results_export() -> None:
    observer = _observe(_scenario("add"))
    ep = torch.export.export(
        _scenario("add").model,
        observer.infer_arguments(),
        dynamic_shapes=observer.infer_dynamic_shapes(),
    )
    assert len(ep.range_constraints) == 2


def test_keyword_results_export() -> None:
    scenario = _scenario("linear")
    observer = _observe(scenario)
    ep = torch.export.export(
        scenario.model,
        (),
        kwargs=observer.infer_arguments(),
        dynamic_shapes=observer.infer_dynamic_shapes(),
    )
    assert len(ep.range_constraints) == 1


# -- what is kept -------------------------------------------------------------------------------
def test_store_n_calls_bounds_the_stored_observations_not_the_observed_calls() -> None:
    model, observer = Toy(), InputObserver()
    with observer(model, store_n_calls=2):
        for n in range(2, 7):
            model(torch.randn(n, 3))
    assert (observer.num_obs(), observer.num_calls()) == (2, 5)


def test_dynamic_shapes_use_calls_beyond_the_stored_ones() -> None:
    model, observer = Toy(), InputObserver()
    with observer(model, store_n_calls=1):
        model(torch.randn(2, 3))
        model(torch.randn(2, 4))
    assert observer.infer_dynamic_shapes() == ({1: D},)


def test_infer_arguments_cannot_index_an_unstored_call() -> None:
    model, observer = Toy(), InputObserver()
    with observer(model, store_n_calls=1):
        model(torch.randn(2, 3))
        model(torch.randn(3, 3))
    with pytest.raises(CaptureError, match="no stored observation 1: 1 stored"):
        observer.infer_arguments(1)


def test_each_with_block_stores_store_n_calls_more() -> None:
    model, observer = Toy(), InputObserver()
    for _ in range(2):
        with observer(model, store_n_calls=1):
            model(torch.randn(2, 3))
            model(torch.randn(3, 3))
    assert (observer.num_obs(), observer.num_calls()) == (2, 4)


def test_stored_tensors_are_copies_taken_before_the_forward() -> None:
    class Inplace(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.mul_(0)

    model, observer, x = Inplace(), InputObserver(), torch.ones(2, 3)
    with observer(model):
        model(x)
    assert observer.infer_arguments()[0].sum().item() == 6.0


def test_shapes_are_taken_before_the_forward_grows_the_cache() -> None:
    class Appends(torch.nn.Module):
        def forward(self, x: torch.Tensor, past_key_values: Any) -> torch.Tensor:
            past_key_values.update(torch.zeros(1, 2, 1, 4), torch.zeros(1, 2, 1, 4), 0)
            return x

    model, observer = Appends(), InputObserver()
    with observer(model):
        model(torch.zeros(1, 1), past_key_values=_cache(3, layers=1))
        model(torch.zeros(1, 1), past_key_values=_cache(5, layers=1))
    args = observer.infer_arguments()
    assert string_type(args["past_key_values"], with_shape=True) == (
        "DynamicCache(key_cache=#1[T1s1x2x3x4], value_cache=#1[T1s1x2x3x4])"
    )


def test_forward_is_restored_after_the_block() -> None:
    model, observer = Toy(), InputObserver()
    with observer(model):
        assert "forward" in model.__dict__
    assert "forward" not in model.__dict__


def test_the_wrapper_keeps_the_signature() -> None:
    import inspect

    model, observer = Toy(), InputObserver()
    with observer(model):
        assert list(inspect.signature(model.forward).parameters) == ["x", "ys", "n", "flag"]


def test_a_call_that_raises_is_not_observed_and_the_error_propagates() -> None:
    class Fails(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.shape[0] == 3:
                raise ValueError("boom")
            return x

    model, observer = Fails(), InputObserver()
    with observer(model):
        model(torch.zeros(2, 3))
        with pytest.raises(ValueError, match="boom"):
            model(torch.zeros(3, 3))
    assert observer.num_calls() == 1


def test_an_observation_failure_does_not_break_the_call_but_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import capture.seeds.observer

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("cannot describe")

    monkeypatch.setattr(capture.seeds.observer, "describe", broken)
    model, observer = Toy(), InputObserver()
    with observer(model):
        assert model(torch.ones(2)).sum().item() == 2.0
    with pytest.raises(CaptureError, match="1 calls could not be observed.*cannot describe"):
        observer.infer_dynamic_shapes()


def test_other_method_name() -> None:
    class Two(torch.nn.Module):
        def step(self, x: torch.Tensor) -> torch.Tensor:
            return x

    model, observer = Two(), InputObserver()
    with observer(model, method_name="step"):
        model.step(torch.zeros(2))
        model.step(torch.zeros(3))
    assert observer.infer_dynamic_shapes() == ({0: D},)


def test_unknown_method_name_raises() -> None:
    with pytest.raises(CaptureError, match="Toy has no method 'generate' to observe"):
        with InputObserver()(Toy(), method_name="generate"):
            pass


def test_nothing_observed_raises() -> None:
    with pytest.raises(CaptureError, match="nothing was observed"):
        InputObserver().infer_dynamic_shapes()


# -- value_if_missing, missing optionals ---------------------------------------------------------
def test_value_if_missing_unknown_name_raises() -> None:
    with pytest.raises(CaptureError, match=r"value_if_missing\['pixel'\]: the method takes no"):
        with InputObserver(value_if_missing={"pixel": torch.zeros(1)})(Toy()):
            pass


def test_value_if_missing_by_position() -> None:
    observer = _toy(
        ((torch.zeros(2, 3),), {}),
        ((torch.zeros(3, 3), [torch.zeros(3)]), {}),
        value_if_missing={1: [torch.zeros(0)]},
    )
    assert observer.infer_dynamic_shapes() == ({0: D}, [{0: D}])
    assert string_type(observer.infer_arguments(), with_shape=True) == "(T1s2x3,#1[T1s0])"


def test_missing_argument_without_value_if_missing_raises_with_advice() -> None:
    scenario = _scenario("multimodal")
    scenario.value_if_missing = {}
    with pytest.raises(
        ObservationMismatch,
        match=re.escape(
            "kwargs['pixel_values'] is passed in call 0 but not in call 1, the call with the most "
            "tensors. torch.export needs one set of arguments: pass InputObserver(value_if_missing"
            "={'pixel_values': <a value, e.g. an empty tensor>})"
        ),
    ):
        _observe(scenario).infer_dynamic_shapes()


def test_missing_optional_tensor_becomes_an_empty_tensor() -> None:
    observer = _toy(
        ((torch.zeros(3, 4), [torch.zeros(3)]), {}),
        ((torch.zeros(4, 4), [torch.zeros(4)]), {}),
        ((torch.zeros(5, 4),), {}),
    )
    assert string_type(observer.infer_arguments(2), with_shape=True) == "(T1s5x4,#1[T1s0])"


def test_missing_optional_tensor_without_dynamic_dim_becomes_zeros() -> None:
    observer = _toy(
        ((torch.zeros(3, 4), [torch.ones(3)]), {}),
        ((torch.zeros(5, 4),), {}),
    )
    filled = observer.infer_arguments(1)[1][0]
    assert (tuple(filled.shape), filled.sum().item()) == ((3,), 0.0)


def test_uninitialized_cache_layers_are_missing_leaves() -> None:
    import transformers

    empty = transformers.DynamicCache(config=transformers.LlamaConfig(num_hidden_layers=2))
    model, observer = Toy(), InputObserver()
    with observer(model):
        model(torch.zeros(1, 4), ys=empty)
        model(torch.zeros(1, 1), ys=_cache(4))
        model(torch.zeros(1, 1), ys=_cache(5))
    assert observer.infer_dynamic_shapes() == {"x": {1: D}, "ys": [{2: D}] * 4}
    assert string_type(observer.infer_arguments(0), with_shape=True) == (
        "dict(x:T1s1x4,ys:DynamicCache(key_cache=#2[T1s1x2x0x4,T1s1x2x0x4], "
        "value_cache=#2[T1s1x2x0x4,T1s1x2x0x4]))"
    )


def test_explicit_none_is_not_passed() -> None:
    observer = _toy(
        ((torch.zeros(2, 3),), {"ys": None}),
        ((torch.zeros(3, 3),), {}),
    )
    assert observer.infer_dynamic_shapes() == ({0: D},)


# -- mismatches ---------------------------------------------------------------------------------
def test_list_length_change_names_the_path() -> None:
    observer = _toy(
        ((torch.zeros(2, 3), [torch.zeros(2), torch.zeros(2)]), {}),
        ((torch.zeros(3, 3), [torch.zeros(3), torch.zeros(3), torch.zeros(3)]), {}),
    )
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("args[1][2] is in call 1 but not in call 0: the structure of 'ys' changed"),
    ):
        observer.infer_dynamic_shapes()


def test_cache_layer_count_change_names_the_path() -> None:
    observer = _toy(
        ((torch.zeros(1, 3),), {"ys": _cache(3, layers=2)}),
        ((torch.zeros(1, 4),), {"ys": _cache(4, layers=3)}),
    )
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("kwargs['ys'].key_cache[2] is in call 1 but not in call 0"),
    ):
        observer.infer_dynamic_shapes()


def test_rank_change_names_the_path() -> None:
    observer = _toy(((torch.zeros(2, 3),), {}), ((torch.zeros(3, 3, 4),), {}))
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("args[0] has rank 3 in call 1 but rank 2 in call 0"),
    ):
        observer.infer_dynamic_shapes()


def test_dtype_change_names_the_path() -> None:
    observer = _toy(((torch.zeros(2, 3),), {}), ((torch.zeros(3, 3, dtype=torch.float16),), {}))
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("args[0] is torch.float16 in call 1 but torch.float32 in call 0"),
    ):
        observer.infer_arguments()


def test_scalar_value_change_names_the_path() -> None:
    observer = _toy(((torch.zeros(2, 3),), {"n": 3}), ((torch.zeros(3, 3),), {"n": 4}))
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("kwargs['n'] is 4 in call 1 but 3 in call 0: torch.export bakes scalars"),
    ):
        observer.infer_dynamic_shapes()


def test_scalar_passed_once_and_defaulted_once_is_a_change() -> None:
    observer = _toy(((torch.zeros(2, 3),), {"n": 3}), ((torch.zeros(3, 3),), {}))
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("kwargs['n'] is 3 in call 0 but not passed (default 1) in call 1"),
    ):
        observer.infer_dynamic_shapes()


def test_scalar_equal_to_its_default_is_not_passed() -> None:
    observer = _toy(((torch.zeros(2, 3),), {"n": 1}), ((torch.zeros(3, 3),), {}))
    assert observer.infer_dynamic_shapes() == ({0: D},)


def test_constant_scalar_is_kept_with_no_dynamic_shape() -> None:
    observer = _toy(((torch.zeros(2, 3),), {"flag": True}), ((torch.zeros(3, 3),), {"flag": True}))
    assert observer.infer_dynamic_shapes() == {"x": {0: D}, "flag": None}
    assert string_type(observer.infer_arguments(), with_shape=True) == "dict(x:T1s2x3,flag:bool)"


def test_tensor_then_scalar_names_the_path() -> None:
    observer = _toy(((torch.zeros(2, 3), [torch.zeros(2)]), {}), ((torch.zeros(3, 3), [3]), {}))
    with pytest.raises(
        ObservationMismatch, match=re.escape("args[1][0] is a int in call 1 but a tensor in call 0")
    ):
        observer.infer_dynamic_shapes()


def test_positional_then_keyword_becomes_keyword_only() -> None:
    # Documented result (capture.seeds.alignment): the same argument passed by position in one call
    # and by name in another is one argument; the results are keyword-only and export.
    model, observer = Toy(), InputObserver()
    with observer(model):
        model(torch.zeros(2, 3), [torch.zeros(2)])
        model(torch.zeros(3, 3), ys=[torch.zeros(3)])
    ds = observer.infer_dynamic_shapes()
    kwargs = observer.infer_arguments()
    assert ds == {"x": {0: D}, "ys": [{0: D}]}
    assert string_type(kwargs, with_shape=True) == "dict(x:T1s2x3,ys:#1[T1s2])"
    ep = torch.export.export(model, (), kwargs=kwargs, dynamic_shapes=ds)
    assert len(ep.range_constraints) == 2


def test_given_inputs_are_checked_against_the_observed_calls() -> None:
    observer = _toy(((torch.zeros(2, 3), [torch.zeros(2)]), {}), ((torch.zeros(3, 3),), {}))
    with pytest.raises(
        ObservationMismatch,
        match=re.escape("args[1][1] is in the given inputs but not in call 0"),
    ):
        observer.infer_arguments((torch.zeros(4, 3), [torch.zeros(4), torch.zeros(4)]))


def test_given_inputs_are_completed() -> None:
    observer = _toy(
        ((torch.zeros(2, 3), [torch.zeros(2)]), {}),
        ((torch.zeros(3, 3), [torch.zeros(3)]), {}),
        ((torch.zeros(4, 3),), {}),
    )
    given = observer.infer_arguments((torch.zeros(6, 3),))
    assert string_type(given, with_shape=True) == "(T1s6x3,#1[T1s0])"


def test_infer_arguments_flat_lists_the_tensors() -> None:
    observer = _observe(_scenario("masked"))
    assert [tuple(t.shape) for t in observer.infer_arguments(flat=True)] == [(2, 10), (0, 10)]


def test_infer_arguments_as_args_kwargs() -> None:
    positional = _observe(_scenario("add")).infer_arguments(as_args_kwargs=True)
    keywords = _observe(_scenario("linear")).infer_arguments(as_args_kwargs=True)
    assert string_type(positional, with_shape=True) == "((T1s2x6,T1s2x6),{})"
    assert string_type(keywords, with_shape=True) == "((),dict(x:T1s2x8,labels:T7s2))"


# -- set_batch_dimension_for ----------------------------------------------------------------------
def test_set_batch_dimension_for_names_and_positions() -> None:
    observer = _toy(
        ((torch.zeros(1, 3), [torch.zeros(1, 5)]), {}),
        ((torch.zeros(1, 4), [torch.zeros(1, 5)]), {}),
    )
    assert observer.infer_dynamic_shapes({"ys"}) == ({1: D}, [{0: D}])
    assert observer.infer_dynamic_shapes({0}) == ({0: D, 1: D}, [{}])


def test_set_batch_dimension_for_unknown_name_raises() -> None:
    observer = _toy(((torch.zeros(1, 3),), {}))
    with pytest.raises(CaptureError, match="set_batch_dimension_for: unknown argument 'batch'"):
        observer.infer_dynamic_shapes({"batch"})


# -- *args and **kwargs ----------------------------------------------------------------------------
def test_var_positional_dynamic_shapes_go_under_its_name() -> None:
    class VarArgs(torch.nn.Module):
        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            return args[0] + args[1]

    model, observer = VarArgs(), InputObserver()
    with observer(model):
        model(torch.zeros(2, 3), torch.zeros(2, 3))
        model(torch.zeros(4, 3), torch.zeros(4, 3))
    ds = observer.infer_dynamic_shapes()
    args = observer.infer_arguments()
    assert ds == {"args": ({0: D}, {0: D})}
    ep = torch.export.export(model, args, dynamic_shapes=ds)
    assert len(ep.range_constraints) == 1


def test_var_keyword_dynamic_shapes_go_under_its_name() -> None:
    class VarKw(torch.nn.Module):
        def forward(self, x: torch.Tensor, **kwargs: torch.Tensor) -> torch.Tensor:
            return x + kwargs["z"]

    model, observer = VarKw(), InputObserver()
    with observer(model):
        model(torch.zeros(2, 3), z=torch.zeros(2, 3))
        model(torch.zeros(4, 3), z=torch.zeros(4, 3))
    assert observer.infer_dynamic_shapes() == {"x": {0: D}, "kwargs": {"z": {0: D}}}
    assert list(observer.infer_arguments()) == ["x", "z"]


# -- a real transformers model --------------------------------------------------------------------
def test_tiny_llama_generate() -> None:
    from fixtures.models import prompts, tiny_llama

    model, observer = tiny_llama(), InputObserver()
    with observer(model), torch.no_grad():
        model.generate(**prompts(2, 5), max_new_tokens=3, do_sample=False)
    ds = observer.infer_dynamic_shapes()
    assert observer.num_calls() == 3
    assert ds[cache_argument()] == [{2: D}] * 4
    assert ds["input_ids"] == {1: D}
    kwargs = observer.infer_arguments()
    assert string_type(kwargs[cache_argument()], with_shape=True) == (
        "DynamicCache(key_cache=#2[T1s2x2x0x16,T1s2x2x0x16], "
        "value_cache=#2[T1s2x2x0x16,T1s2x2x0x16])"
    )


# -- the store -------------------------------------------------------------------------------------
def test_to_store_writes_every_observed_call(tmp_path: Path) -> None:
    model, observer = Toy(), InputObserver()
    with observer(model, store_n_calls=1):
        for n in (2, 3, 3, 4):
            model(torch.zeros(n, 5))
    assert observer.to_store(tmp_path / "store", name="toy") == 4
    store = capture.open_store(tmp_path / "store")
    rows = store.query(
        "SELECT path, kind, shape FROM leaves WHERE side = 'input' AND kind = 'tensor' "
        "ORDER BY shape[1]"
    ).to_pylist()
    assert [(r["path"], r["shape"]) for r in rows] == [
        ("args[0]", [2, 5]),
        ("args[0]", [3, 5]),
        ("args[0]", [3, 5]),
        ("args[0]", [4, 5]),
    ]


def test_to_store_merges_integer_ranges_of_one_signature(tmp_path: Path) -> None:
    model, observer = Toy(), InputObserver()
    with observer(model):
        for lo, hi in ((3, 9), (1, 4), (5, 12)):
            model(torch.tensor([[lo, hi]]))
        model(torch.zeros(1, 0, dtype=torch.int64))  # empty: its range is unknown
    observer.to_store(tmp_path, name="toy")
    rows = (
        capture.open_store(tmp_path)
        .query("SELECT dims, int_min, int_max, calls FROM signatures ORDER BY calls DESC")
        .to_pylist()
    )
    # the observer keeps lows and highs as the calls columns do and merges them with
    # the writer's rule (stats_merge.merge_items): the smallest low and the largest high, per
    # tensor.
    assert [(r["int_min"], r["int_max"], r["calls"]) for r in rows] == [
        ([1], [12], 3),
        ([None], [None], 1),
    ]


def test_to_store_records_missing_arguments_not_value_if_missing(tmp_path: Path) -> None:
    observer = _observe(_scenario("masked"))
    observer.to_store(tmp_path)
    rows = (
        capture.open_store(tmp_path)
        .query(
            "SELECT kind, count(*) AS n FROM leaves "
            "WHERE side = 'input' AND path = 'kwargs[''mask'']'"
            " GROUP BY kind ORDER BY kind"
        )
        .to_pylist()
    )
    assert rows == [{"kind": "missing", "n": 1}, {"kind": "tensor", "n": 2}]


def test_to_store_writes_cache_paths(tmp_path: Path) -> None:
    observer = _observe(_scenario("llm"))
    observer.to_store(tmp_path)
    paths = (
        capture.open_store(tmp_path)
        .query("SELECT DISTINCT path FROM leaves WHERE side = 'input' ORDER BY path")
        .column("path")
        .to_pylist()
    )
    assert "kwargs['past_key_values'].key_cache[1]" in paths


def test_to_store_without_observations_raises(tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="nothing was observed"):
        InputObserver().to_store(tmp_path)


# -- export-safe path through replay (the seeds' own arguments cannot be exported) -----------------
@pytest.mark.parametrize(
    ("name", "options"),
    [
        ("masked", {}),
        ("llm", {"set_batch_dimension_for": True}),
        ("multimodal", {"set_batch_dimension_for": True}),
    ],
)
def test_to_store_then_replay_export(name: str, options: dict[str, Any], tmp_path: Path) -> None:
    import replay

    scenario = _scenario(name)
    observer = _observe(scenario)
    observer.to_store(tmp_path)
    result = replay.export(scenario.model, str(tmp_path), **options)
    assert result.complete
    assert result.programs


class _Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


# Each step: the observer's block enters or exits, the recorder starts or stops, or the model is
# called once. Every order of the two wrappers' lives, nested or overlapping.
ORDERS = {
    "observer_then_recorder_nested": ["o+", "r+", "call", "r-", "call", "o-", "call"],
    "recorder_then_observer_nested": ["r+", "o+", "call", "o-", "call", "r-", "call"],
    "observer_ends_first": ["o+", "r+", "call", "o-", "call", "call", "r-", "call"],
    "recorder_ends_first": ["r+", "o+", "call", "r-", "call", "call", "o-", "call"],
}


@pytest.mark.parametrize("order", sorted(ORDERS))
def test_observer_and_recorder_nest_in_every_order_and_count_every_call(
    order: str, tmp_path: Path
) -> None:
    model = _Linear()
    observer = InputObserver()
    recorder = capture.Recorder(model, tmp_path / "store", flush_seconds=60)
    block = observer(model)
    observing = recording = False
    seen = {"observer": 0, "recorder": 0}
    for step in ORDERS[order]:
        if step == "o+":
            block.__enter__()
            observing = True
        elif step == "o-":
            block.__exit__(None, None, None)
            observing = False
        elif step == "r+":
            recorder.start()
            recording = True
        elif step == "r-":
            recorder.stop()
            recording = False
        else:
            model(torch.rand(2, 4))
            seen["observer"] += observing
            seen["recorder"] += recording
    assert observer.num_calls() == seen["observer"]
    stats = recorder.stats()
    assert (stats["recorded"], stats["errors"]) == (seen["recorder"], 0)
    assert "forward" not in vars(model)  # no wrapper, live or dead, is left behind
