"""`capture demo`: records a tiny Llama, shows the analysis, exports the decode step."""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture.cli.demo import DEMO_MODEL, EXPORT_GROUP, INCOMPLETE, MAX_NEW_TOKENS, WORKLOAD
from capture.cli.main import cli
from capture.store_api import open_store
from fixtures.names import LLAMA_CACHE


@dataclass(frozen=True)
class DemoRun:
    store: Path
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One real `capture demo --store DIR` run, shared by the checks below."""
    store = tmp_path_factory.mktemp("demo") / "store"
    result = CliRunner(env={"CAPTURE_STORE": None}).invoke(
        cli, ["demo", "--store", str(store)], prog_name="capture"
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return DemoRun(store, result.exit_code, result.stdout, result.stderr)


def test_demo_exits_0_when_the_export_covers_every_signature(demo: DemoRun) -> None:
    assert demo.exit_code == 0, demo.stderr


def test_demo_records_one_call_per_generated_token(demo: DemoRun) -> None:
    with open_store(demo.store) as store:
        rows = store.query("SELECT model, count(*) AS calls FROM calls GROUP BY model").to_pylist()
    assert rows == [{"model": DEMO_MODEL, "calls": len(WORKLOAD) * MAX_NEW_TOKENS}]


def test_demo_reports_progress_on_stderr(demo: DemoRun) -> None:
    steps = [line[:5] for line in demo.stderr.splitlines() if line.startswith("[")]
    assert steps == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]


def test_demo_prints_the_summary_then_the_dims_then_the_export(demo: DemoRun) -> None:
    headings = [line for line in demo.stdout.splitlines() if line.startswith("== ")]
    assert headings == [
        f"== Model {DEMO_MODEL} ==",
        f"== Dynamic dims of the {EXPORT_GROUP} group (capture dims) ==",
        f"== Export of the {EXPORT_GROUP} group (capture export) ==",
    ]


def test_demo_finds_the_mask_length_relation(demo: DemoRun) -> None:
    assert f"  decode  attention_mask_1 = {LLAMA_CACHE}_2 + 1\n" in demo.stdout


def test_demo_covers_every_recorded_decode_signature(demo: DemoRun) -> None:
    # The decode group: a cache holding tensors and an attention mask (padded batches).
    sql = f"""
        SELECT count(*) AS signatures, sum(calls)::BIGINT AS calls FROM signatures
        WHERE in_structure IN (
            SELECT structure_id FROM structures
            WHERE path = 'kwargs[''attention_mask'']' AND kind = 'tensor'
            INTERSECT
            SELECT structure_id FROM structures
            WHERE path = 'kwargs[''{LLAMA_CACHE}''].key_cache[0]' AND kind = 'tensor')
    """
    with open_store(demo.store) as store:
        (row,) = store.query(sql).to_pylist()
    n, calls = row["signatures"], row["calls"]
    summary = f"\n{n} of {n} recorded signatures covered ({calls} of {calls} calls), "
    assert summary in demo.stdout
    # one row per group, covered/total and the worst difference in 3 digits.
    assert re.search(
        rf"\n{EXPORT_GROUP} +{n}/{n} +{calls}/{calls} +([1-9]\d*)/\1 +\d\.\d\de-\d\d\n", demo.stdout
    )
    # the probes (unseen sizes inside the recorded ranges) are checked and reported.
    assert re.search(r"calls\), ([1-9]\d*) of \1 probes covered, max abs diff", demo.stdout)


def test_demo_ends_with_the_store_and_the_next_commands(demo: DemoRun) -> None:
    tail = demo.stdout.rstrip("\n").splitlines()[-6:]
    assert tail[0] == f"The store is at {demo.store}. Try:"
    assert [line.split()[:5] for line in tail[1:]] == [
        ["capture", "--store", str(demo.store), "summary"],
        ["capture", "--store", str(demo.store), "dims", "--python"],
        ["capture", "--store", str(demo.store), "query", '"SELECT'],
        # the report is the first thing one tries after the demo.
        ["capture", "--store", str(demo.store), "report", "--out"],
        # the demo's model is installed with capture (fixtures/ is not).
        ["capture", "--store", str(demo.store), "export", "capture.demo_model:tiny_llama"],
    ]


@pytest.mark.parametrize("command", ["summary", "dims", "query"])
def test_demo_suggests_commands_that_work(demo: DemoRun, command: str) -> None:
    (line,) = [
        line
        for line in demo.stdout.splitlines()
        if line.startswith("  capture --store ") and line.split()[3] == command
    ]
    argv = shlex.split(line)
    result = CliRunner().invoke(cli, argv[1:], prog_name="capture")
    assert result.exit_code == 0, result.output
    assert result.stdout != ""


def test_demo_refuses_a_store_that_already_holds_a_demo(demo: DemoRun) -> None:
    # The global option this time: the demo records where `capture --store` points.
    result = CliRunner().invoke(cli, ["--store", str(demo.store), "demo"], prog_name="capture")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"Error: the store at {demo.store} already holds a {DEMO_MODEL} recording from an "
        "earlier demo; remove it or pass another store, e.g. capture demo --store "
        "/tmp/capture-demo\n"
    )


def test_demo_rejects_two_different_stores(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["--store", str(tmp_path / "a"), "demo", "--store", str(tmp_path / "b")],
        prog_name="capture",
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "two stores given" in result.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_demo_help_imports_no_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom capture.cli.main import cli\n"
        "r = CliRunner().invoke(cli, ['demo', '--help'])\n"
        "assert r.exit_code == 0, r.output\nprint('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "False\n"


@pytest.mark.slow  # two demos, one of them a real process
def test_demo_interrupted_during_its_export_is_replaced_by_the_next(tmp_path: Path) -> None:
    # Ctrl-C once the recording is done (during the export) leaves a recording the next demo
    # replaces, as docs/cli.md says, rather than refusing it as a tiny-llama recording.
    store = tmp_path / "store"
    # Ctrl-C as a terminal delivers it, whatever launched the tests: a background job of a
    # shell without job control starts with SIGINT ignored, and its children inherit that.
    ctrl_c_on = (
        "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "runpy.run_module('capture.cli', run_name='__main__', alter_sys=True)"
    )
    with subprocess.Popen(
        [sys.executable, "-c", ctrl_c_on, "demo", "--store", str(store)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as first:
        assert first.stderr is not None
        seen = []
        for line in first.stderr:
            seen.append(line)
            if line.startswith("[4/4] exporting"):
                break
        first.send_signal(signal.SIGINT)
        rest = first.stderr.read()
        assert first.wait(timeout=120) == 130, "".join(seen) + rest
    assert rest.endswith("Error: interrupted (Ctrl-C)\n"), rest
    assert "Traceback" not in rest

    again = CliRunner(env={"CAPTURE_STORE": None}).invoke(
        cli, ["demo", "--store", str(store)], prog_name="capture"
    )
    assert again.exit_code == 0, again.output
    assert again.stderr.startswith(
        f"note: replacing the recording of an interrupted demo in {store}\n"
    )
    with open_store(store) as opened:  # one demo's calls, not two
        calls = opened.query("SELECT count(*) AS n FROM calls").column("n").to_pylist()
    assert calls == [len(WORKLOAD) * MAX_NEW_TOKENS]
    assert not (store / INCOMPLETE).exists()
