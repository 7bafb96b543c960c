"""replay.inputs.source: dynamic_shapes as Python source, without importing torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import capture
import replay
from capture.errors import ReplayError
from capture.store_api import Store
from fixtures.names import cache_argument
from fixtures.stores import record_llama, record_seed_scenarios
from replay.inputs.source import dynamic_shapes_source


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store")
    record_seed_scenarios(path, names=["add_broadcast", "llm", "masked"])
    record_llama(path)
    return path


@pytest.fixture(scope="module")
def store(root: Path) -> Iterator[Store]:
    with capture.open_store(root) as opened:
        yield opened


def _run(source: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    exec(compile(source, "<dynamic_shapes>", "exec"), namespace)  # the test checks it runs
    return namespace


def test_positional_model(store: Store) -> None:
    assert dynamic_shapes_source(store, "add_broadcast") == textwrap.dedent(
        """\
        from torch.export import Dim

        # Bounded hints with the recorded ranges: the program refuses sizes beyond them, and
        # torch.export finds the shared dims and relations while tracing (checked at run time).

        # add_broadcast, group g0: 3 calls, 3 distinct signatures
        # g = replay.export_inputs(store, 'add_broadcast').group('g0')
        # torch.export.export(g.module(model), g.args, g.kwargs, dynamic_shapes=dynamic_shapes)
        x_0 = Dim.DYNAMIC(min=2, max=4)
        x_1 = Dim.DYNAMIC(min=6, max=8)
        dynamic_shapes = ({0: x_0, 1: x_1}, {1: x_1})"""
    )


def test_derived_dims_and_a_cache(store: Store) -> None:
    expected = textwrap.dedent(
        """\
        from torch.export import Dim

        # Bounded hints with the recorded ranges: the program refuses sizes beyond them, and
        # torch.export finds the shared dims and relations while tracing (checked at run time).

        # LlamaForCausalLM, group decode: 9 calls, 9 distinct signatures
        # passed through **kwargs: return_dict; g.module(model) names them
        # (torch.export cannot match dynamic_shapes to **kwargs entries)
        # g = replay.export_inputs(store, 'LlamaForCausalLM').group('decode')
        # torch.export.export(g.module(model), g.args, g.kwargs, dynamic_shapes=dynamic_shapes)
        batch = Dim.DYNAMIC(min=2, max=3)
        past_key_values_2 = Dim.DYNAMIC(min=4, max=9)
        attention_mask_1 = Dim.DYNAMIC(min=5, max=10)  # = past_key_values_2 + 1 in every call
        dynamic_shapes = {
            'input_ids': {0: batch},
            'attention_mask': {0: batch, 1: attention_mask_1},
            'position_ids': {0: batch},
            'past_key_values': [
                {0: batch, 2: past_key_values_2},
                {0: batch, 2: past_key_values_2},
                {0: batch, 2: past_key_values_2},
                {0: batch, 2: past_key_values_2},
            ],
            'use_cache': None,
            'logits_to_keep': None,
            'return_dict': None,
        }"""
    )
    # the cache argument as the installed transformers spells it
    expected = expected.replace("past_key_values", cache_argument())
    assert dynamic_shapes_source(store, "LlamaForCausalLM", group="decode") == expected


def test_unnamed_dims(store: Store) -> None:
    source = dynamic_shapes_source(store, "llm", named_dims=False, set_batch_dimension_for=True)
    assert source.splitlines()[5:7] == [
        "dynamic_shapes = {",
        "    'input_ids': {0: Dim.DYNAMIC, 1: Dim.DYNAMIC},",
    ]


def test_one_variable_per_group_and_the_largest_as_dynamic_shapes(store: Store) -> None:
    namespace = _run(dynamic_shapes_source(store, "masked"))
    assert namespace["dynamic_shapes"] is namespace["dynamic_shapes_g0"]
    assert str(namespace["dynamic_shapes_g1"]) == "{'x': None}"


def _bounds(value: Any) -> Any:
    """The (min, max) of every dim in a dynamic_shapes structure (named Dim or bounded hint)."""
    if isinstance(value, dict):
        return {k: _bounds(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bounds(v) for v in value]
    return None if value is None else (value.min, value.max)


def test_the_source_has_the_ranges_export_inputs_builds(store: Store) -> None:
    namespace = _run(dynamic_shapes_source(store, "LlamaForCausalLM", group="decode"))
    expected = replay.export_inputs(store, "LlamaForCausalLM", named_dims=True, groups=["decode"])
    assert _bounds(namespace["dynamic_shapes"]) == _bounds(expected.dynamic_shapes)


def test_hostile_names_stay_identifiers_and_comments() -> None:
    from replay.inputs.source import _comment, _identifier

    assert _identifier("import os\nx") == "import_os_x"
    assert _identifier("class") == "class_"
    assert _identifier("Dim") == "Dim_"
    assert _identifier("2x") == "_2x"
    assert _comment("m\nimport os") == "# m\\nimport os"


# Slow: a whole torch.export (15-25 s); keeps the fast suite under 3 minutes.
@pytest.mark.slow
def test_printed_code_exports_the_demo_llama(tmp_path: Path) -> None:
    # `capture dims --python`, pasted as its comments say, exports both groups.
    from click.testing import CliRunner

    from capture.cli.demo import DEMO_MODEL, MAX_NEW_TOKENS, WORKLOAD
    from capture.cli.main import cli

    model, _ = record_llama(tmp_path, WORKLOAD, max_new_tokens=MAX_NEW_TOKENS, name=DEMO_MODEL)
    printed = CliRunner().invoke(cli, ["--store", str(tmp_path), "dims", "--python"])
    assert printed.exit_code == 0, printed.output
    namespace = _run(printed.stdout)
    assert f"replay.export_inputs(store, {DEMO_MODEL!r}).group('decode')" in printed.stdout
    import torch

    inputs = replay.export_inputs(tmp_path, DEMO_MODEL)
    for name in ("prefill", "decode"):
        g = inputs.group(name)
        with capture.register_flattening_functions():
            program = torch.export.export(
                g.module(model),
                g.args,
                g.kwargs,
                dynamic_shapes=namespace[f"dynamic_shapes_{name}"],
            )
        uppers = [r.upper for r in program.range_constraints.values()]
        assert uppers and all(u <= 64 for u in uppers), (name, program.range_constraints)


def test_several_models_get_one_section_each(store: Store) -> None:
    source = dynamic_shapes_source(store)
    assert "dynamic_shapes_add_broadcast_g0 = (" in source
    assert "dynamic_shapes_LlamaForCausalLM_decode = {" in source
    _run(source)


def test_unknown_group(store: Store) -> None:
    with pytest.raises(ReplayError, match=r"no group 'nope' \(groups: g0\)"):
        dynamic_shapes_source(store, "add_broadcast", group="nope")


def test_torch_is_not_imported(root: Path) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import capture
        from replay.inputs.source import dynamic_shapes_source
        with capture.open_store({str(root)!r}) as store:
            dynamic_shapes_source(store, "LlamaForCausalLM")
        assert "torch" not in sys.modules, "torch was imported"
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert done.returncode == 0, done.stderr


def test_the_commented_calls_are_python_once_uncommented(store: Store) -> None:
    # each commented call is Python (not "with g = replay.export_inputs(...).group(...):").
    source = dynamic_shapes_source(store, "LlamaForCausalLM")
    calls = [
        line[2:]
        for line in source.splitlines()
        if line.startswith(("# g = ", "# torch.export.export("))
    ]
    assert len(calls) == 2 * 4  # two lines for each of the 4 groups
    compile("\n".join(calls), "<uncommented>", "exec")
