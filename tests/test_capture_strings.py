"""capture.string_type: the seeds' one-line notation for nested inputs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from capture import make_dynamic_cache, string_type
from capture.errors import CaptureError
from capture.pytree.nodes import make_encoder_decoder_cache
from capture.seeds.strings import onnx_dtype_code


@pytest.mark.parametrize(
    ("dtype", "code"),
    [
        (torch.float32, 1),
        (torch.uint8, 2),
        (torch.int8, 3),
        (torch.uint16, 4),
        (torch.int16, 5),
        (torch.int32, 6),
        (torch.int64, 7),
        (torch.bool, 9),
        (torch.float16, 10),
        (torch.float64, 11),
        (torch.bfloat16, 16),
    ],
)
def test_tensor_dtype_codes_are_onnx_tensorproto_codes(dtype: torch.dtype, code: int) -> None:
    assert string_type(torch.zeros(2, 3, dtype=dtype), with_shape=True) == f"T{code}s2x3"


def test_tensor_without_shape_shows_rank() -> None:
    assert string_type(torch.zeros(2, 3, 4)) == "T1r3"


def test_scalar_tensor_has_empty_shape() -> None:
    assert string_type(torch.tensor(3.0), with_shape=True) == "T1s"


def test_empty_tensor_shape_keeps_zero() -> None:
    assert string_type(torch.ones(0, 10), with_shape=True) == "T1s0x10"


def test_positional_tuple_as_in_seed_000() -> None:
    args = (torch.randn(2, 6), torch.randn(2, 6))
    assert string_type(args, with_shape=True) == "(T1s2x6,T1s2x6)"


def test_one_element_tuple_has_trailing_comma() -> None:
    assert string_type((torch.zeros(2),), with_shape=True) == "(T1s2,)"


def test_keyword_dict_as_in_seed_000() -> None:
    kwargs = dict(x=torch.randn(2, 8), labels=torch.randint(0, 4, (2,)))
    assert string_type(kwargs, with_shape=True) == "dict(x:T1s2x8,labels:T7s2)"


def test_list_shows_its_length() -> None:
    assert string_type([torch.zeros(1), torch.zeros(2)], with_shape=True) == "#2[T1s1,T1s2]"


def test_long_list_shows_first_element_only() -> None:
    assert string_type([1] * 25) == "#25[int,...]"


def test_long_tuple_shows_first_element_only() -> None:
    assert string_type(tuple(range(30))) == "#30(int,...)"


@pytest.mark.parametrize(
    ("value", "plain", "with_min_max"),
    [
        (None, "None", "None"),
        (True, "bool", "bool=True"),
        (3, "int", "int=3"),
        (2.5, "float", "float=2.5"),
        ("a", "str", "str"),
    ],
)
def test_scalars(value: object, plain: str, with_min_max: str) -> None:
    assert string_type(value) == plain
    assert string_type(value, with_min_max=True) == with_min_max


def test_nested_scalars_and_containers() -> None:
    assert string_type((1, ["r", 6.6])) == "(int,#2[str,float])"


def test_empty_dict() -> None:
    assert string_type({}) == "{}"


def test_dynamic_shapes_dict() -> None:
    ds = {0: torch.export.Dim.DYNAMIC, 1: "seq", 2: torch.export.Dim("batch")}
    assert string_type(ds) == "{0:DYNAMIC,1:DYN(seq),2:Dim(batch)}"


def test_min_max_of_a_tensor() -> None:
    t = torch.tensor([[1.0, 3.0]])
    assert string_type(t, with_shape=True, with_min_max=True) == "T1s1x2[1.0,3.0:A2.0]"


def test_min_max_of_an_empty_tensor() -> None:
    assert string_type(torch.ones(0, 2), with_shape=True, with_min_max=True) == "T1s0x2[empty]"


def test_device_prefix_on_cpu() -> None:
    assert string_type(torch.zeros(2), with_shape=True, with_device=True) == "CT1s2"


def test_dynamic_cache_as_in_seed_002() -> None:
    cache = make_dynamic_cache([(torch.rand(1, 4, 10, 32), torch.rand(1, 4, 10, 32))] * 2)
    assert string_type(cache, with_shape=True) == (
        "DynamicCache(key_cache=#2[T1s1x4x10x32,T1s1x4x10x32], "
        "value_cache=#2[T1s1x4x10x32,T1s1x4x10x32])"
    )


def test_uninitialized_dynamic_cache_layers_print_none() -> None:
    import transformers

    cache = transformers.DynamicCache(config=transformers.LlamaConfig(num_hidden_layers=2))
    assert string_type(cache, with_shape=True) == (
        "DynamicCache(key_cache=#2[None,None], value_cache=#2[None,None])"
    )


def test_static_cache_as_in_seed_004() -> None:
    from transformers import LlamaConfig
    from transformers.cache_utils import StaticCache

    config = LlamaConfig(
        hidden_size=96, num_attention_heads=1, num_key_value_heads=1, num_hidden_layers=1
    )
    cache = StaticCache(config=config, max_cache_len=96)
    cache.early_initialization(
        batch_size=2, num_heads=1, head_dim=96, dtype=torch.float32, device=torch.device("cpu")
    )
    assert string_type(cache, with_shape=True) == (
        "StaticCache(key_cache=#1[T1s2x1x96x96], value_cache=#1[T1s2x1x96x96])"
    )


def test_encoder_decoder_cache() -> None:
    self_attention = make_dynamic_cache([(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))])
    cross = make_dynamic_cache([(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))])
    text = string_type(make_encoder_decoder_cache(self_attention, cross), with_shape=True)
    assert text == (
        "EncoderDecoderCache("
        "self_attention_cache=DynamicCache(key_cache=#1[T1s1x2x3x4], value_cache=#1[T1s1x2x3x4]), "
        "cross_attention_cache=DynamicCache(key_cache=#1[T1s1x2x5x4], value_cache=#1[T1s1x2x5x4]))"
    )


def test_dataclass_prints_its_fields() -> None:
    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor
        loss: torch.Tensor | None = None

    assert string_type(Out(torch.zeros(2, 3)), with_shape=True) == "Out(logits:T1s2x3)"


def test_module_prints_its_class() -> None:
    assert string_type(torch.nn.Linear(2, 2)) == "Linear(...)"


def test_unknown_type_raises_a_typed_error_naming_it() -> None:
    class Thing:
        pass

    with pytest.raises(CaptureError, match=r"test_capture_strings\..*Thing.*ignore=True"):
        string_type(Thing())


def test_unknown_type_with_ignore() -> None:
    class Thing:
        pass

    assert string_type([Thing()], ignore=True) == "#1[Thing(...)]"


def test_onnx_dtype_code_of_unknown_dtype_raises() -> None:
    with pytest.raises(CaptureError, match="complex32"):
        onnx_dtype_code(torch.complex32)


def test_module_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys, capture.seeds.strings as s; "
        "print(s.string_type((1, [None, 'a'], {'k': 2.0})), "
        "'torch' in sys.modules, 'transformers' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out == "(int,#2[None,str],dict(k:float)) False False\n"
