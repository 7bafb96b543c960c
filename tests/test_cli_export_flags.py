"""``capture export``'s options are built from `replay.ExportOptions`' fields: every field is
an option of the command or, deliberately, of the Python API only, and the command line's own
spellings (``--group``, ``all``, ``--time-budget 0``, ``--no-merge``) reach the API's values."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

from capture.cli.export import export_command
from capture.cli.export_flags import cli_fields, export_keywords
from capture.cli.main import cli
from replay import ExportOptions

# Fields the command does not offer, and why: a field missing from both this set and the
# command's options fails the first test, so a new field cannot be forgotten.
API_ONLY = {
    "value_if_missing": "tensors: not a command-line value",
    "set_state": "a callable",
    "onnx": "--out PATH.onnx sets it",
    "modules": "--out sets it: an artifact holds the recorded sub-modules",
    "fill_missing": "the Python API's",
    "seed": "the Python API's",
    "device": "the Python API's",
    "strict": "the Python API's",
    "atol": "the Python API's",
    "rtol": "the Python API's",
    "max_payloads": "the Python API's",
    "max_payload_bytes": "the Python API's",
}


def _help() -> str:
    result = CliRunner().invoke(cli, ["export", "--help"], terminal_width=200)
    assert result.exit_code == 0
    return result.stdout


def test_every_field_is_an_option_of_the_command_or_named_api_only() -> None:
    docs = ExportOptions.docs()
    offered = {name for name, doc in docs.items() if doc.flag is not None}
    assert offered | set(API_ONLY) == {f.name for f in dataclasses.fields(ExportOptions)}
    assert offered & set(API_ONLY) == set()
    text = _help()
    for name in offered:
        for flag in docs[name].flag.split("/"):  # type: ignore[union-attr]
            assert f"{flag} " in text or f"{flag}\n" in text, (name, flag)


@pytest.mark.parametrize("name", sorted(cli_fields()))
def test_every_option_states_its_default_and_the_fields_help(name: str) -> None:
    doc = ExportOptions.docs()[name]
    option = next(p for p in export_command.params if p.name == name)
    assert isinstance(option, click.Option)
    assert option.help is not None and option.help.startswith(doc.help)
    assert "Default: " in option.help


def test_the_options_defaults_are_the_fields_defaults() -> None:
    context = export_command.make_context("export", ["m:f"])
    values = {name: context.params[name] for name in cli_fields()}
    assert ExportOptions.of(**export_keywords(values)) == ExportOptions()


def test_the_command_lines_spellings_become_the_apis_values() -> None:
    args = ["m:f", "--group", "decode", "--group", "prefill", "--set-batch-dimension-for", "0"]
    args += ["--set-batch-dimension-for", "input_ids", "--time-budget", "0", "--no-merge"]
    args += ["--allow-ops", "mylib", "--spec", "shapes", "--named-dims", "--probes", "0"]
    context = export_command.make_context("export", args)
    keywords = export_keywords({name: context.params[name] for name in cli_fields()})
    options = ExportOptions.of(**keywords)
    assert options.groups == ("decode", "prefill")
    assert options.set_batch_dimension_for == (0, "input_ids")
    assert (options.time_budget, options.merge, options.spec) == (None, False, "shapes")
    assert (options.named_dims, options.probes, options.allow_ops) == (True, 0, ("mylib",))


def test_all_makes_every_batch_dimension_dynamic() -> None:
    context = export_command.make_context("export", ["m:f", "--set-batch-dimension-for", "all"])
    values = {name: context.params[name] for name in cli_fields()}
    assert export_keywords(values)["set_batch_dimension_for"] is True


@pytest.mark.parametrize(
    ("flag", "value"), [("--probes", "-1"), ("--max-regimes", "0"), ("--time-budget", "-1")]
)
def test_a_value_below_the_fields_minimum_is_a_usage_error(flag: str, value: str) -> None:
    result = CliRunner().invoke(cli, ["export", "m:f", flag, value])
    assert result.exit_code == 2
    assert result.stdout == ""
    assert flag in result.stderr


def test_the_docstring_lists_every_field_from_its_doc() -> None:
    doc = ExportOptions.__doc__ or ""
    for name, option in ExportOptions.docs().items():
        assert f"        {name}: {option.help.split()[0]}" in doc
