"""Builds dynamic shapes from any input (seed 004).

`replay.all_dynamic_shape_from_inputs` marks every dim of every tensor dynamic, with a name
``d_<tensor>_<dim>``, including the tensors inside a transformers cache. torch.export does not take
a cache object in ``dynamic_shapes`` but the list of its flattened tensors: with this project's
registration (`capture.pytree.nodes`) a `DynamicCache` or `StaticCache` of L layers flattens to
``[key_0, ..., key_{L-1}, value_0, ..., value_{L-1}]``, so its dynamic shapes are a *flat* list of
2L dicts. The seed, printed with an older transformers and another registration, shows the nested
``[[keys...], [values...]]`` form instead; torch.export rejects that form for ours.

The seed downloads a tiny model configuration from the Hugging Face hub to get StaticCache
inputs; this script builds them from a small config in code (nothing is downloaded). The seed's
last print, the dynamic shapes the hub helper ships with the model, is written out by hand
here, in the flat form. Its legend image is left out.

Run: ``python examples/dynamic_shapes_from_inputs.py``
"""

import pprint

import torch
from transformers import LlamaConfig
from transformers.cache_utils import StaticCache

from capture import make_dynamic_cache, string_type
from replay import all_dynamic_shape_from_inputs

# Standard inputs for a LLM with a dynamic cache ------------------------------------------------
bsize, nheads, slen, dim = 2, 1, 30, 96

inputs = dict(
    input_ids=torch.randint(15, size=(2, 3), dtype=torch.int64),
    attention_mask=torch.randint(1, size=(2, 33), dtype=torch.int64),
    position_ids=torch.arange(3, dtype=torch.int64),
    past_key_values=make_dynamic_cache(
        [(torch.randn(bsize, nheads, slen, dim), torch.randn(bsize, nheads, slen, dim))]
    ),
)

print(string_type(inputs, with_shape=True))

# Every dimension is considered dynamic.
ds = all_dynamic_shape_from_inputs(inputs)
pprint.pprint(ds)

# What about a StaticCache? -----------------------------------------------------------------------
# A one-layer Llama configuration with one key/value head of dimension 96 and a static cache of
# 96 positions, the shapes the seed gets from the hub.
config = LlamaConfig(
    vocab_size=32,
    hidden_size=96,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=1,
    num_key_value_heads=1,
    head_dim=96,
)
cache = StaticCache(config=config, max_cache_len=96)
cache.early_initialization(
    batch_size=2, num_heads=1, head_dim=96, dtype=torch.float32, device=torch.device("cpu")
)
inputs = dict(
    input_ids=torch.randint(15, size=(2, 3), dtype=torch.int64),
    attention_mask=torch.ones((2, 1, 3, 96), dtype=torch.bool),
    cache_position=torch.arange(3, dtype=torch.int64),
    past_key_values=cache,
)
print(string_type(inputs, with_shape=True))

# The seed's message: here the serialization functions are this project's (capture.pytree.nodes),
# which all_dynamic_shape_from_inputs registers for itself.
ds = all_dynamic_shape_from_inputs(inputs)
if ds["past_key_values"]:
    print("transformers implemented serialization function for StaticCache.")
else:
    print("We need to use serialization function implemented in this package.")

pprint.pprint(ds)

# The dynamic shapes a model-specific helper would give instead (the seed's hub helper), for
# comparison: only some dims are dynamic, some named, some with ranges.
batch = torch.export.Dim("batch", min=1, max=1024)
pprint.pprint(
    {
        "attention_mask": {0: batch, 2: "seq"},
        "cache_position": {0: "seq"},
        "input_ids": {0: batch, 1: "seq_length"},
        "past_key_values": [{0: batch}, {0: batch}],
    }
)
