"""Runs every script in examples/ and compares its stdout with the seed it reproduces.

Each example prints what its seed document printed (the seed lines are embedded below,
verbatim, without the documentation's indentation), then, where the seed only showed the
export as code, a few lines of its own (``ADDED``), compared exactly as well.

Normalisations, each applied to both sides unless said otherwise, and why:

- N1 torch changed: the seeds ran a torch whose ``Dim.DYNAMIC`` repr was
  ``_DimHint(type=<_DimHintType.DYNAMIC: 3>, min=None, max=None, _factory=True)``; torch 2.13
  prints ``DimHint(DYNAMIC)``. The long form is replaced in the seed text, and since pprint then
  wraps lines differently, every multi-line bracketed block is joined into one line (pprint's
  separators are ``", "`` whether or not it breaks the line).
- N2 our registration (DESIGN §4): seed 004 prints a cache's dynamic shapes in the nested
  ``[[{keys}], [{values}]]`` form of an older transformers; ours is the flat ``[{keys}, {values}]``
  list torch.export accepts for our registration. The nested form is rewritten in the seed text.
- N3 ExportedProgram prints hold the source path and line of the traced code
  (``# File: /home/...:24 in forward``, or ``# No stacktrace found`` when the source is not a
  file): those comment lines are dropped; every other line (the ``def forward`` signature with
  its symbolic shapes, the graph signature, the range constraints) is compared.
- N4 random values: numbers inside printed tensors come from ``torch.randn``; each becomes ``N``.
- N5 whitespace: trailing spaces are stripped (the documentation pads empty lines). Seed 003's
  blank lines come from the documentation's cell layout (sphinx-gallery prints a blank line before
  a cell's value), so that example is compared without blank lines.
- N6 symbol names in ADDED lines (``s77``) are torch's and become ``s?``; the seed lines keep
  theirs (torch 2.13 names them as the seed's torch did).
- N7 our registration (DESIGN §4): in transformers 5 a ``StaticLayer`` writes at its
  fill level (``cumulative_length``, a 0-d tensor), so our ``StaticCache`` flattens it after
  the keys and values: `all_dynamic_shape_from_inputs` gives it an entry (``{}``: a 0-d tensor
  has no axis), which torch.export requires for our registration. Seed 004's StaticCache shapes
  (the pprint after "transformers implemented serialization function for StaticCache.") get
  that entry; the seed's own ``data["dynamic_shapes"]``, printed as given, does not.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

_DIMHINT = re.compile(
    r"_DimHint\(type=<_DimHintType\.DYNAMIC: 3>,\s*min=None,\s*max=None,\s*_factory=True\)"
)
_NESTED_CACHE = re.compile(r"\[\[(\{[^\[\]]*\})\], \[(\{[^\[\]]*\})\]\]")
_NUMBER = re.compile(r"\s*-?\d+\.\d*(?:e[+-]\d+)?")  # torch switches to e-notation for wide ranges
_SYMBOL = re.compile(r"\bs\d+\b")
_TRACE_COMMENT = re.compile(r"^\s*# (File: |No stacktrace found)")
_STATIC_SAID = "transformers implemented serialization function for StaticCache."
_STATIC_FILL = re.compile(r"('past_key_values': \[.*\})\]\}$")

# -- seed 000 / 001: plot_input_observer -----------------------------------------------------------
SEED_000 = """\
Observations stored: 3
Dynamic shapes: ({0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)})
Inferred args: (T1s2x6,T1s2x6)

Observations stored (linear): 3
Dynamic shapes (linear): {'x': {0: DimHint(DYNAMIC)}, 'labels': {0: DimHint(DYNAMIC)}}
Inferred kwargs: dict(x:T1s2x8,labels:T7s2)

Observations stored (masked): 3
Dynamic shapes (masked): {'x': {0: DimHint(DYNAMIC)}, 'mask': {0: DimHint(DYNAMIC)}}
Inferred kwargs: dict(x:T1s2x10,mask:T1s0x10)
"""  # noqa: E501

ADDED_000 = """\

Exported (add): def forward(self, x: "f32[s?, s?]", y: "f32[s?, s?]"):
Exported (linear): def forward(self, p_weight: "f32[4, 8]", p_bias: "f32[4]", x: "f32[s?, 8]", labels: "i64[s?]"):
Exporting the masked model with the seed's arguments fails: RuntimeError
replay.export (masked): complete = True
  g0: def forward(self, x: "f32[s?, 10]", mask: "f32[s?, 10]"):
  g1: def forward(self, x: "f32[2, 10]"):
"""  # noqa: E501

# -- seed 002: plot_input_observer_transformers ----------------------------------------------------
SEED_002 = """\
Observations stored: 3
Dynamic shapes (add model): ({0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, {1: DimHint(DYNAMIC)})
Inferred arguments: (T1s2x6,T1s1x6)

Observations stored (LLM): 2
Dynamic shapes (LLM): {'input_ids': {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, 'attention_mask': {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, 'past_key_values': [{0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}]}
Inferred kwargs: dict(input_ids:T7s1x10,attention_mask:T7s1x10,past_key_values:DynamicCache(key_cache=#2[T1s1x4x10x32,T1s1x4x10x32], value_cache=#2[T1s1x4x10x32,T1s1x4x10x32]))

Observations stored (multimodal): 3
Dynamic shapes (multimodal): {'input_ids': {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, 'pixel_values': {0: DimHint(DYNAMIC)}, 'attention_mask': {0: DimHint(DYNAMIC), 1: DimHint(DYNAMIC)}, 'past_key_values': [{0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}, {0: DimHint(DYNAMIC), 2: DimHint(DYNAMIC)}]}
Inferred kwargs: dict(input_ids:T7s1x1,pixel_values:T1s0x3x224x224,attention_mask:T7s1x21,past_key_values:DynamicCache(key_cache=#2[T1s1x4x20x32,T1s1x4x20x32], value_cache=#2[T1s1x4x20x32,T1s1x4x20x32]))
"""  # noqa: E501

ADDED_002 = """\

Exported (add model): def forward(self, x: "f32[s?, s?]", y: "f32[1, s?]"):
Exporting the LLM model with the seed's arguments fails: ValueError
replay.export (LLM): complete = True
  decode: def forward(self, input_ids: "i64[s?, s?]", attention_mask: "i64[s?, s?]", past_key_values_key_cache_0: "f32[s?, 4, s?, 32]", past_key_values_key_cache_1: "f32[s?, 4, s?, 32]", past_key_values_value_cache_0: "f32[s?, 4, s?, 32]", past_key_values_value_cache_1: "f32[s?, 4, s?, 32]"):
Exporting the multimodal model with the seed's arguments fails: ValueError
replay.export (multimodal): complete = True
  decode: def forward(self, input_ids: "i64[s?, 1]", attention_mask: "i64[s?, s?]", past_key_values_key_cache_0: "f32[s?, 4, s?, 32]", past_key_values_key_cache_1: "f32[s?, 4, s?, 32]", past_key_values_value_cache_0: "f32[s?, 4, s?, 32]", past_key_values_value_cache_1: "f32[s?, 4, s?, 32]"):
  prefill: def forward(self, input_ids: "i64[s?, 20]", pixel_values: "f32[s?, 3, 224, 224]", attention_mask: "i64[s?, 20]"):
"""  # noqa: E501

# -- seed 003: plot_export_with_args_kwargs --------------------------------------------------------
_EP_STATIC = """\
ExportedProgram:
    class GraphModule(torch.nn.Module):
        def forward(self, x: "f32[5, 6]", y: "f32[1, 6]"):
             # File: /home/xadupre/github/onnx-diagnostic/_doc/examples/plot_export_with_args_kwargs.py:24 in forward, code: return x + y
            add: "f32[5, 6]" = torch.ops.aten.add.Tensor(x, y);  x = y = None
            return (add,)
            
Graph signature: 
    # inputs
    x: USER_INPUT
    y: USER_INPUT
    
    # outputs
    add: USER_OUTPUT
    
Range constraints: {}
"""  # noqa: E501, W293, W291


def _ep_dynamic(line: int) -> str:
    return f"""\
ExportedProgram:
    class GraphModule(torch.nn.Module):
        def forward(self, x: "f32[s77, s27]", y: "f32[1, s27]"):
             # File: /home/xadupre/github/onnx-diagnostic/_doc/examples/plot_export_with_args_kwargs.py:{line} in forward, code: return x + y
            add: "f32[s77, s27]" = torch.ops.aten.add.Tensor(x, y);  x = y = None
            return (add,)
            
Graph signature: 
    # inputs
    x: USER_INPUT
    y: USER_INPUT
    
    # outputs
    add: USER_OUTPUT
    
Range constraints: {{s77: VR[2, int_oo], s27: VR[2, int_oo]}}
"""  # noqa: E501, W293, W291


_DS_KWARGS = """\
((),
 {'x': {0: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
                    min=None,
                    max=None,
                    _factory=True),
        1: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
                    min=None,
                    max=None,
                    _factory=True)},
  'y': {1: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
                    min=None,
                    max=None,
                    _factory=True)}})
"""

SEED_003 = (
    _EP_STATIC
    + """\
(({0: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
               min=None,
               max=None,
               _factory=True),
   1: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
               min=None,
               max=None,
               _factory=True)},
  {1: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
               min=None,
               max=None,
               _factory=True)}),
 {})
"""
    + _ep_dynamic(24)
    + """\
tensor([[ 0.2834,  1.8801,  1.6971,  1.2482,  0.3882,  0.2971],
        [ 0.6628,  0.5869,  1.7854,  1.5276,  0.9795,  1.2183],
        [-0.0845,  2.3054,  1.3487,  2.4448,  0.3833,  0.8428],
        [ 0.7447, -0.1401,  2.1664,  0.7647, -0.8946,  0.7256],
        [ 0.4848, -0.3465,  1.5665, -0.2105,  1.2154,  1.0959]])
"""
    + _DS_KWARGS
    + _ep_dynamic(65)
    + """\
tensor([[-1.6650, -0.5573, -3.2661,  1.0115,  0.8640,  1.4891],
        [-1.0856, -1.2043, -1.8986, -0.9633,  0.9584,  0.3970],
        [-0.2224,  0.2094, -0.8428, -0.6128,  1.1452,  0.8981],
        [ 1.3362, -2.1080, -2.1970, -1.8784,  2.0855,  1.3917],
        [-0.5973,  0.3691, -0.9418, -0.8789,  1.5264,  1.1057]])
(({0: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
               min=None,
               max=None,
               _factory=True),
   1: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
               min=None,
               max=None,
               _factory=True)},),
 {'y': {1: _DimHint(type=<_DimHintType.DYNAMIC: 3>,
                    min=None,
                    max=None,
                    _factory=True)}})
"""
    + _DS_KWARGS
    + _ep_dynamic(95)
)

# -- seed 004: plot_dynamic_shapes_what ------------------------------------------------------------
SEED_004 = """\
dict(input_ids:T7s2x3,attention_mask:T7s2x33,position_ids:T7s3,past_key_values:DynamicCache(key_cache=#1[T1s2x1x30x96], value_cache=#1[T1s2x1x30x96]))
{'attention_mask': {0: 'd_1_0', 1: 'd_1_1'},
 'input_ids': {0: 'd_0_0', 1: 'd_0_1'},
 'past_key_values': [[{0: 'd_3_0', 1: 'd_3_1', 2: 'd_3_2', 3: 'd_3_3'}],
                     [{0: 'd_4_0', 1: 'd_4_1', 2: 'd_4_2', 3: 'd_4_3'}]],
 'position_ids': {0: 'd_2_0'}}
dict(input_ids:T7s2x3,attention_mask:T9s2x1x3x96,cache_position:T7s3,past_key_values:StaticCache(key_cache=#1[T1s2x1x96x96], value_cache=#1[T1s2x1x96x96]))
transformers implemented serialization function for StaticCache.
{'attention_mask': {0: 'd_1_0', 1: 'd_1_1', 2: 'd_1_2', 3: 'd_1_3'},
 'cache_position': {0: 'd_2_0'},
 'input_ids': {0: 'd_0_0', 1: 'd_0_1'},
 'past_key_values': [[{0: 'd_3_0', 1: 'd_3_1', 2: 'd_3_2', 3: 'd_3_3'}],
                     [{0: 'd_4_0', 1: 'd_4_1', 2: 'd_4_2', 3: 'd_4_3'}]]}
{'attention_mask': {0: Dim('batch', min=1, max=1024), 2: 'seq'},
 'cache_position': {0: 'seq'},
 'input_ids': {0: Dim('batch', min=1, max=1024), 1: 'seq_length'},
 'past_key_values': [[{0: Dim('batch', min=1, max=1024)}],
                     [{0: Dim('batch', min=1, max=1024)}]]}
"""  # noqa: E501

CASES = [
    ("input_observer.py", SEED_000, ADDED_000, False),
    ("input_observer_transformers.py", SEED_002, ADDED_002, False),
    ("export_with_args_kwargs.py", SEED_003, "", True),
    ("dynamic_shapes_from_inputs.py", SEED_004, "", False),
]


def _join_brackets(lines: list[str]) -> list[str]:
    """Joins the lines of a bracketed block (a pprint or a tensor print) into one line (N1)."""
    out: list[str] = []
    depth = 0
    for line in lines:
        if depth > 0:
            out[-1] = f"{out[-1]} {line.strip()}"
        else:
            out.append(line)
        text = re.sub(r"'[^']*'|\"[^\"]*\"", "", line)
        depth += sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")
    return out


def _normalise(text: str, *, seed: bool, blank_lines: bool) -> list[str]:
    if seed:
        text = _DIMHINT.sub("DimHint(DYNAMIC)", text)  # N1
    lines = [line.rstrip() for line in text.splitlines()]  # N5
    lines = [line for line in lines if not _TRACE_COMMENT.match(line)]  # N3
    if not blank_lines:
        lines = [line for line in lines if line]  # N5 (seed 003)
    lines = _join_brackets(lines)  # N1
    if seed:
        lines = [_NESTED_CACHE.sub(r"[\1, \2]", line) for line in lines]  # N2
        lines = [
            _STATIC_FILL.sub(r"\1, {}]}", line) if i and lines[i - 1] == _STATIC_SAID else line
            for i, line in enumerate(lines)
        ]  # N7
    return [_NUMBER.sub(" N", line) if line.startswith("tensor(") else line for line in lines]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "seed", "added", "ignore_blank_lines"), CASES, ids=[c[0] for c in CASES]
)
def test_example_prints_what_its_seed_printed(
    script: str, seed: str, added: str, ignore_blank_lines: bool
) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    keep_blank = not ignore_blank_lines
    actual = _normalise(result.stdout, seed=False, blank_lines=keep_blank)
    expected_seed = _normalise(seed, seed=True, blank_lines=keep_blank)
    expected_added = _normalise(added, seed=False, blank_lines=keep_blank)
    assert actual[: len(expected_seed)] == expected_seed
    assert [
        _SYMBOL.sub("s?", line) for line in actual[len(expected_seed) :]
    ] == expected_added  # N6


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(c[0] for c in CASES)
