"""`capture profiles` and `capture buckets` from the shell."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from capture.cli.main import cli
from fixtures.traffic import record_traffic

# batch: 1 x 6 calls, 2 x 3, 6 x 1; length: 4 x 6, 9 x 4.
TRAFFIC = [((1, 4), 6), ((2, 9), 3), ((6, 9), 1)]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("engines")
    record_traffic(root, TRAFFIC)
    return str(root)


def _run(store: str, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["--store", store, *args])
    return result.exit_code, result.stdout, result.stderr


def test_buckets_prints_exact_padding_and_ready_lines(store: str) -> None:
    code, out, err = _run(store, "buckets", "--symbol", "batch", "--budget", "2")
    assert code == 0
    # {2, 6}: the six batch-1 calls pad 1 each (6); {1, 6} would pad 3 x 4 = 12.
    # Useful work: 1 x 6 + 2 x 3 + 6 x 1 = 18.
    assert out == (
        "pair, symbol batch (batch size; groups g0):\n"
        "10 calls, 3 distinct sizes from 1 to 6\n"
        "\n"
        "bucket  calls  smallest  padding\n"
        "------  -----  --------  -------\n"
        "     2      9         1        6\n"
        "     6      1         6        0\n"
        "\n"
        "padding with these 2 sizes: 6 (33.33% of the 18 useful; 0.6 per call)\n"
        "padding with vLLM's default sizes cut to 2 [1, 2]: 0 (0.00%; 0 per call), and 1 "
        "calls (10.00%) larger than 2 that no captured size holds\n"
        "\n"
        "vLLM:   --compilation-config "
        '\'{"cudagraph_capture_sizes": [2, 6], "compile_sizes": [2, 6]}\'\n'
        "Python: CompilationConfig(cudagraph_capture_sizes=[2, 6], compile_sizes=[2, 6])\n"
        "SGLang: --cuda-graph-bs 2 6\n"
    )
    assert err == ""


def test_buckets_json_is_one_document(store: str) -> None:
    code, out, _ = _run(store, "buckets", "--symbol", "x_1", "--budget", "1", "-f", "json")
    document = json.loads(out)
    assert code == 0
    assert (document["buckets"], document["padding"]) == ([9], 5 * 6)


def test_buckets_unknown_symbol_is_one_error_line(store: str) -> None:
    code, out, err = _run(store, "buckets", "--symbol", "seq", "--budget", "2")
    assert code == 1
    assert out == ""
    assert err == (
        "Error: no call group has a symbol 'seq'; pass --symbol with one of batch, x_1 "
        "(see `capture dims`)\n"
    )


def test_profiles_trtexec(store: str) -> None:
    code, out, err = _run(store, "profiles", "-f", "trtexec")
    assert code == 0
    assert out == (
        "# pair, group g0, profile 0: 10 calls, opt = a signature sent by 6 of them\n"
        "--minShapes=x:1x4x2,mask:1x4 --optShapes=x:1x4x2,mask:1x4 --maxShapes=x:6x9x2,mask:6x9\n"
    )
    assert err == ""


def test_profiles_json_rows(store: str) -> None:
    code, out, _ = _run(store, "profiles", "--opt", "p90", "-f", "json")
    rows = json.loads(out)
    assert code == 0
    # p90 of batch is 2, of length 9: (2, 9) was sent.
    assert [r["opt_shape"] for r in rows] == [[2, 9, 2], [2, 9]]


def test_engine_commands_do_not_import_torch_or_matplotlib(store: str) -> None:
    script = (
        "import sys\nfrom capture.cli.main import cli\n"
        "cli(sys.argv[1:], standalone_mode=False)\n"
        "sys.stderr.write('imported: ' + ' '.join(m for m in ('torch', 'matplotlib') "
        "if m in sys.modules) + '\\n')\n"
    )
    for args in (["profiles"], ["buckets", "--symbol", "batch", "--budget", "2"]):
        result = subprocess.run(
            [sys.executable, "-c", script, "--store", store, *args],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parents[1],
        )
        assert result.returncode == 0, result.stderr
        assert result.stderr.splitlines()[-1] == "imported: ", args


def test_buckets_picks_the_only_symbol(tmp_path: Path) -> None:
    # --symbol is not required when the calls have one dynamic symbol.
    record_traffic(tmp_path, [((1, 4), 2), ((3, 4), 1)])  # the length never varies
    code, out, err = _run(str(tmp_path), "buckets", "--budget", "1")
    assert (code, err) == (0, "")
    assert out.startswith("pair, symbol batch (batch size; groups g0):\n3 calls, ")


def test_buckets_without_symbol_sizes_the_batch_symbol(store: str) -> None:
    # the calls have 2 symbols (batch, x_1): without --symbol, the batch one, named first
    code, out, err = _run(store, "buckets", "--budget", "2")
    assert (code, err) == (0, "")
    assert out.startswith("pair, symbol batch (batch size; groups g0):\n")
    assert out == _run(store, "buckets", "--symbol", "batch", "--budget", "2")[1]


def test_buckets_of_a_length_prints_no_batch_size_flags(store: str) -> None:
    # no --cuda-graph-bs lines for a cache length.
    code, out, err = _run(store, "buckets", "--symbol", "x_1", "--budget", "1")
    assert (code, err) == (0, "")
    assert "vLLM" not in out.replace("vLLM's and SGLang's capture sizes", "")
    assert "--cuda-graph-bs" not in out
    assert out.endswith(
        "x_1 is a sequence length: vLLM's and SGLang's capture sizes are batch sizes,\n"
        "so no engine flags are printed; pad each sequence length up to the next of these "
        "sizes.\n"
    )
