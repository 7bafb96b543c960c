"""`capture report`: a self-contained HTML page with plots, and its data."""

from __future__ import annotations

import base64
import html
import io
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import capture
from capture.analysis.groups import analyze
from capture.cli.main import cli
from capture.cli.progress import Progress
from capture.engines.report_data import served_calls, timeline
from capture.engines.report_html import build_report
from capture.store_api import Store
from fixtures.names import LLAMA_CACHE
from fixtures.traffic import record_traffic
from replay.inputs.source import export_plan

ROOT = Path(__file__).resolve().parents[1]
TRAFFIC = [((1, 10), 2), ((1, 20), 2), ((2, 30), 3), ((4, 30), 3)]


@pytest.fixture(scope="module")
def pair_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report-pair")
    record_traffic(root, TRAFFIC)
    return root


@pytest.fixture(scope="module")
def pair(pair_root: Path) -> Iterator[Store]:
    with capture.open_store(pair_root) as store:
        yield store


@pytest.fixture(scope="module")
def llama_page(llama: Store) -> str:
    return build_report(llama, plan=export_plan)


def _svg(page: str, alt: str) -> str:
    """The SVG text of the page's image `alt` (text is kept as text: svg.fonttype none)."""
    (data,) = re.findall(
        rf'<img alt="{re.escape(alt)}" src="data:image/svg\+xml;base64,([^"]+)">', page
    )
    return base64.b64decode(data).decode("utf-8")


def _texts(svg: str) -> list[str]:
    return [html.unescape(t).strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]


def test_page_inlines_every_plot(llama_page: str) -> None:
    images = re.findall(
        r'<img alt="[^"]*" src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)">', llama_page
    )
    # One distribution per symbol (batch, input_ids_1, the cache's length), calls over time,
    # optional inputs, drift.
    assert len(images) == 6


def test_page_needs_no_network(llama_page: str) -> None:
    assert re.findall(r"(?:src|href)\s*=\s*[\"']?(?:https?:|//)", llama_page) == []
    assert "<script" not in llama_page
    assert "@import" not in llama_page and "url(" not in llama_page


def test_table_cells_stay_short(llama_page: str) -> None:
    cells = re.findall(r"<td[^>]*>(.*?)</td>", llama_page, flags=re.S)
    lines = [re.sub(r"<[^>]+>|&[a-z#0-9]+;", "x", c) for c in cells]
    longest = max(len(line) for c in lines for line in c.split("\n"))
    assert longest <= 60  # summary's dims column stays short


def test_page_shows_every_group_and_symbol(llama_page: str) -> None:
    for name in ("decode", "decode_no_attention_mask", "prefill", "prefill_no_attention_mask"):
        assert f"<h4>Group {name}:" in llama_page
    assert f'<td class="id">{LLAMA_CACHE}_2</td><td>cache length</td>' in llama_page


def test_first_screen_shows_the_groups_and_their_shapes(llama_page: str) -> None:
    # before the first plot: every group, its input shapes with their symbols, and the
    # symbols' recorded ranges.
    first = llama_page[: llama_page.index("<img")]
    row = first[first.index("</span>decode</td>") :].split("</tr>")[0]
    assert (
        "input_ids [batch, 1]\nattention_mask [batch, attention_mask_1]\n"
        f"position_ids [batch, 1]\n{LLAMA_CACHE} 4 × [batch, 2, {LLAMA_CACHE}_2, 16]" in row
    )
    assert f"batch 2–3\nattention_mask_1 5–10 (= {LLAMA_CACHE}_2 + 1)\n{LLAMA_CACHE}_2 4–9" in row


def test_one_distribution_per_symbol_counts_batch_1(llama_page: str) -> None:
    # one plot per symbol, not per group where it varies: the 8 calls at batch 1 (the
    # *_no_attention_mask groups, where batch is static) are in it. LLAMA_WORKLOAD:
    # batches 1, 2, 1, 2, 3 with 4 calls each: 8 at 1, 8 at 2, 4 at 3.
    svg = _svg(llama_page, "distribution of batch")
    legend = [t for t in _texts(svg) if t.startswith(("decode", "prefill"))]
    assert legend == ["decode", "decode_no_attention_mask", "prefill", "prefill_no_attention_mask"]
    row = llama_page[llama_page.index('<td class="id">batch</td>') :].split("</tr>")[0]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", row)
    # symbol, measures, recorded, p50, p90, p99, exported, probes, buckets
    assert cells == [
        "batch",
        "batch size",
        "1–3",
        "2",
        "3",
        "3",
        "decode 2–3; prefill 2–3",
        "2, 3",
        "1, 2, 3",
    ]


def test_size_axes_are_numeric_and_count_axes_integer(pair_root: Path) -> None:
    # sizes 1, 2, 4 are numbers, not evenly spaced categories (which hide the gaps that
    # decide ranges and buckets), and count axes have no ticks such as 0.5.
    with capture.open_store(pair_root) as store:
        page = build_report(store, plan=export_plan)
    texts = _texts(_svg(page, "distribution of batch"))
    assert "3" in texts  # a size never recorded (batch 1, 2, 4) has its place on the axis
    numbers = [t for t in texts if re.fullmatch(r"[0-9.]+", t)]
    assert numbers and all(re.fullmatch(r"[0-9]+", t) for t in numbers), numbers


def test_each_group_has_its_dynamic_shapes_to_paste(llama_page: str) -> None:
    blocks = [html.unescape(b) for b in re.findall(r"<pre>(.*?)</pre>", llama_page, flags=re.S)]
    assert len(blocks) == 4
    for block in blocks:
        compile(block, "<report dynamic_shapes>", "exec")
    assert "batch = Dim.DYNAMIC(min=2, max=3)" in blocks[0]


def test_drift_heatmap_has_a_colour_scale(llama_page: str) -> None:
    texts = _texts(_svg(llama_page, "input structures over time"))
    assert any(t.startswith("calls per ") for t in texts)  # the colour bar's label


def test_calls_over_time_are_whole_calls_and_say_how_they_are_placed(
    llama: Store, llama_page: str
) -> None:
    groups = analyze(llama)
    tl = timeline(llama, groups[0].model_name, groups)
    assert tl.calls.dtype.kind == "i"  # no bars of 0.2 calls
    assert "those two are placed exactly, the calls between them evenly" in llama_page


def test_timeline_keeps_every_call(llama: Store) -> None:
    groups = analyze(llama)
    tl = timeline(llama, groups[0].model_name, groups)
    assert tl.calls.sum(axis=1).tolist() == [g.calls for g in groups]


def test_served_calls_add_up_the_check_rows_per_group(pair: Store) -> None:
    from capture.state import state_label
    from replay.check.drift import DriftRow

    (group,) = analyze(pair)
    sid = group.structure_id
    label = state_label(group.state or None)  # the module was recorded in training mode
    rows = [
        DriftRow("pair", sid, "g0", "T1s2", 2, True, None, label),
        DriftRow("pair", sid, None, "T1s3", 3, False, "g0: size", label),
        DriftRow("pair", "another", "g1", "T1s4", 5, True, None, label),
        DriftRow("other", sid, "g0", "T1s2", 7, True, None, label),
        DriftRow("pair", sid, "g0", "T1s2", 11, True, None, "another_state"),
    ]
    (served,) = served_calls([group], rows)
    assert (served.calls, served.served_calls) == (5, 2)
    assert (served.signatures, served.served_signatures) == (2, 1)
    assert served.programs == ["g0"]


def test_report_with_an_artifact_says_what_capture_check_says(tmp_path: Path) -> None:
    # One answer for "which calls does the artifact serve": the report uses capture check's rows.
    import torch

    import replay
    from fixtures.traffic import Pair

    root = tmp_path / "store"
    record_traffic(root, [((1, 10), 2), ((1, 20), 2), ((2, 30), 3)])
    torch.manual_seed(0)
    replay.export(Pair(), root, "pair", probes=0).save(tmp_path / "pair.pt2")
    record_traffic(root, [((4, 30), 3)])  # newer traffic: batch 4 is outside [1, 2]
    out = tmp_path / "r.html"
    args = ["--store", str(root), "report", "--artifact", str(tmp_path / "pair.pt2")]
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text(encoding="utf-8")
    section = page[page.index("Served by the artifact") :]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", section)[:7]
    assert cells == ["g0", "10", "7", "70.0%", "4", "3", "g0"]
    check = CliRunner().invoke(
        cli, ["--store", str(root), "check", str(tmp_path / "pair.pt2"), "-f", "json"]
    )
    assert check.exit_code == 3
    assert check.stderr.endswith("served: 3 of 4 recorded signatures, 7 of 10 calls\n")


def test_report_command_writes_the_page(pair_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["--store", str(pair_root), "report", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    # stderr is not a terminal here: no progress line, only what was written.
    assert re.fullmatch(rf"wrote {re.escape(str(out))} \([0-9,]+ KiB\)\n", result.stderr)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_missing_artifact_file_is_one_error_line(pair_root: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli,
        ["--store", str(pair_root), "report", "--artifact", "nope.pt2", "--out", "r.html"],
    )
    assert result.exit_code == 1
    assert (
        result.stderr
        == "Error: no artifact at nope.pt2; pass the .pt2 (or .onnx) that capture export wrote\n"
    )


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_on_a_terminal_and_erases_itself() -> None:
    stream = _Terminal()
    with Progress("report", stream=stream) as progress:
        progress.phase("plotting", 2, 5)
    text = stream.getvalue()
    assert "\rreport: plotting 2/5 (" in text
    assert text.endswith("\r")


def test_progress_is_silent_when_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress("report", stream=stream) as progress:
        progress.phase("plotting", 2, 5)
    assert stream.getvalue() == ""


@pytest.mark.parametrize(
    "code",
    [
        "import capture, capture.store_api",
        "from capture.cli.main import cli; cli(['--store', STORE, 'query', 'SELECT 1'], "
        "standalone_mode=False)",
    ],
    ids=["import-capture", "capture-query"],
)
def test_matplotlib_is_imported_only_by_the_report(pair_root: Path, code: str) -> None:
    script = (
        f"STORE = {str(pair_root)!r}\n{code}\nimport sys\n"
        "sys.stderr.write('matplotlib' in sys.modules and 'loaded' or 'absent')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith("absent")


@pytest.mark.slow
def test_page_renders_its_plots_in_headless_chromium(llama_page: str, tmp_path: Path) -> None:
    from matplotlib.image import imread

    from fixtures.report_screenshot import chromium, screenshot

    if chromium() is None:
        pytest.skip("chromium is not installed (.ci/run installs it with apt-get as root)")
    page = tmp_path / "report.html"
    page.write_text(llama_page, encoding="utf-8")
    shot = tmp_path / "shot.png"
    result = screenshot(page, shot, height=2000)
    assert result.returncode == 0, result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console
    assert "Failed to load resource" not in result.stderr
    pixels = np.rint(imread(shot)[..., :3] * 255).astype(int)
    assert pixels.std() > 10  # not a blank page
    # The first group's bars are drawn in #0969da: the images were decoded and painted.
    bars = np.all(np.abs(pixels - np.array([9, 105, 218])) <= 6, axis=-1)
    assert bars.sum() > 5_000


def test_progress_off_a_terminal_logs_a_plain_line_now_and_then() -> None:
    stream = io.StringIO()
    # a long compaction in a nightly job (stderr a log file) says where it is; a
    # short run writes nothing (the test above), so captured output stays clean.
    with Progress("compact", stream=stream, log_every=0.05) as progress:
        progress.phase("merging calls files", 3, 10)
        time.sleep(0.6)
    lines = stream.getvalue().splitlines()
    assert lines and all(
        re.fullmatch(r"compact: merging calls files 3/10 \(\d+ s\)", line) for line in lines
    )
