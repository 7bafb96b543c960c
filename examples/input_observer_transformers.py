"""InputObserver with a transformers cache (seed 002).

Three scenarios, as in the seed:

1. a simple model with two tensor inputs whose batch and sequence lengths vary;
2. an LLM-like model receiving a `transformers.cache_utils.DynamicCache`, which torch's pytree
   only understands once registered (`capture.register_flattening_functions`);
3. a multimodal model receiving ``pixel_values`` on the first call only, with
   ``value_if_missing`` telling the observer what stands for the missing argument.

The seed shows the export as code only. Its arguments cannot be exported on torch 2.13: the
LLM-like calls all have batch 1 (a dim of size 1 marked dynamic is specialised), and the
multimodal arguments have ``pixel_values`` of batch 0 and a decode length of 1. Section 4
goes through a capture store and `replay.export` instead, which picks arguments with every
dynamic dim >= 2 and exports one program per call group (prefill, decode).

Run: ``python examples/input_observer_transformers.py``
"""

import tempfile

import torch

import replay
from capture import InputObserver, make_dynamic_cache, register_flattening_functions, string_type


def forward_signature(ep: torch.export.ExportedProgram) -> str:
    """The ``def forward(...)`` line of an exported program (its inputs and their shapes)."""
    return next(line.strip() for line in str(ep).splitlines() if "def forward(" in line)


# 1. Simple model: two tensor inputs ----------------------------------------------------------


class AddModel(torch.nn.Module):
    """Adds two tensors element-wise (broadcasting on the batch dimension)."""

    def forward(self, x, y):
        return x + y


model_add = AddModel()

inputs_add = [
    (torch.randn(2, 6), torch.randn(1, 6)),
    (torch.randn(3, 7), torch.randn(1, 7)),
    (torch.randn(4, 8), torch.randn(1, 8)),
]

observer_add = InputObserver()
with observer_add(model_add):
    for x, y in inputs_add:
        model_add(x, y)

# InputObserver keeps the tensors of at most 3 calls by default (store_n_calls=3).
print("Observations stored:", observer_add.num_obs())
assert observer_add.num_obs() == 3

dyn_add = observer_add.infer_dynamic_shapes()
print("Dynamic shapes (add model):", dyn_add)

args_add = observer_add.infer_arguments()
print("Inferred arguments:", string_type(args_add, with_shape=True))

# 2. LLM-like model: inputs with a DynamicCache -----------------------------------------------


class LLMLikeModel(torch.nn.Module):
    """Minimal stand-in for a causal LM forward pass."""

    def forward(self, input_ids, attention_mask=None, past_key_values=None):
        # A real model would compute hidden states here.
        # We just return the inputs unchanged so the example is self-contained.
        return input_ids, past_key_values


n_layers = 2
n_heads = 4
head_dim = 32

# Prefill step: the KV-cache holds 10 tokens.
cache_prefill = make_dynamic_cache(
    [
        (torch.rand(1, n_heads, 10, head_dim), torch.rand(1, n_heads, 10, head_dim))
        for _ in range(n_layers)
    ]
)

# First decode step: the KV-cache now holds 11 tokens.
cache_decode = make_dynamic_cache(
    [
        (torch.rand(1, n_heads, 11, head_dim), torch.rand(1, n_heads, 11, head_dim))
        for _ in range(n_layers)
    ]
)

llm_inputs = [
    dict(
        input_ids=torch.randint(0, 1000, (1, 10)),
        attention_mask=torch.ones(1, 10, dtype=torch.int64),
        past_key_values=cache_prefill,
    ),
    dict(
        input_ids=torch.randint(0, 1000, (1, 1)),
        attention_mask=torch.ones(1, 11, dtype=torch.int64),
        past_key_values=cache_decode,
    ),
]

model_llm = LLMLikeModel()
observer_llm = InputObserver()

# The observer registers the cache classes for itself; the seed's explicit block is kept.
with register_flattening_functions(patch_transformers=True), observer_llm(model_llm):
    for kwargs in llm_inputs:
        model_llm(**kwargs)

print("\nObservations stored (LLM):", observer_llm.num_obs())

# set_batch_dimension_for=True marks dim 0 of every tensor dynamic although both calls use 1.
with register_flattening_functions(patch_transformers=True):
    dyn_llm = observer_llm.infer_dynamic_shapes(set_batch_dimension_for=True)
    kwargs_llm = observer_llm.infer_arguments()

print("Dynamic shapes (LLM):", dyn_llm)
print("Inferred kwargs:", string_type(kwargs_llm, with_shape=True))

# 3. Multimodal model: pixel_values present only on the first call ----------------------------


class MultimodalModel(torch.nn.Module):
    """Minimal stand-in for a vision-language model forward pass."""

    def forward(self, input_ids, pixel_values=None, attention_mask=None, past_key_values=None):
        return input_ids, past_key_values


image_h, image_w = 224, 224

cache_mm_step1 = make_dynamic_cache(
    [
        (torch.rand(1, n_heads, 20, head_dim), torch.rand(1, n_heads, 20, head_dim))
        for _ in range(n_layers)
    ]
)
cache_mm_step2 = make_dynamic_cache(
    [
        (torch.rand(1, n_heads, 21, head_dim), torch.rand(1, n_heads, 21, head_dim))
        for _ in range(n_layers)
    ]
)

mm_inputs = [
    # Prefill: image + text, no past cache yet.
    dict(
        input_ids=torch.randint(0, 1000, (1, 20)),
        pixel_values=torch.rand(1, 3, image_h, image_w),
        attention_mask=torch.ones(1, 20, dtype=torch.int64),
    ),
    # Decode step 1: no image, but a growing KV-cache.
    dict(
        input_ids=torch.randint(0, 1000, (1, 1)),
        attention_mask=torch.ones(1, 21, dtype=torch.int64),
        past_key_values=cache_mm_step1,
    ),
    # Decode step 2.
    dict(
        input_ids=torch.randint(0, 1000, (1, 1)),
        attention_mask=torch.ones(1, 22, dtype=torch.int64),
        past_key_values=cache_mm_step2,
    ),
]

model_mm = MultimodalModel()

# An empty tensor (batch=0) stands for pixel_values when it is absent, for the analysis only.
observer_mm = InputObserver(
    value_if_missing=dict(pixel_values=torch.empty((0, 3, image_h, image_w), dtype=torch.float32))
)

with register_flattening_functions(patch_transformers=True), observer_mm(model_mm):
    for kwargs in mm_inputs:
        model_mm(**kwargs)

print("\nObservations stored (multimodal):", observer_mm.num_obs())

with register_flattening_functions(patch_transformers=True):
    dyn_mm = observer_mm.infer_dynamic_shapes(set_batch_dimension_for=True)
    kwargs_mm = observer_mm.infer_arguments()

print("Dynamic shapes (multimodal):", dyn_mm)
print("Inferred kwargs:", string_type(kwargs_mm, with_shape=True))

# 4. Exporting ---------------------------------------------------------------------------------
print()
ep = torch.export.export(model_add, args_add, dynamic_shapes=dyn_add)
print("Exported (add model):", forward_signature(ep))

# The LLM-like and multimodal arguments above cannot be exported as they are: torch.export
# specializes a dim whose example is 0 or 1 (batch 1, an empty pixel_values, a decode length of
# 1), which contradicts Dim.DYNAMIC. replay builds export-safe arguments from a store instead.
cases = [
    ("LLM", observer_llm, model_llm, kwargs_llm, dyn_llm),
    ("multimodal", observer_mm, model_mm, kwargs_mm, dyn_mm),
]
for label, observer, model, kwargs, dyn in cases:
    with register_flattening_functions(patch_transformers=True):
        try:
            torch.export.export(model, (), kwargs=kwargs, dynamic_shapes=dyn)
            print(f"Exported ({label}) with the seed's arguments")
        except Exception as e:  # the failure is the point of this step
            print(f"Exporting the {label} model with the seed's arguments fails:", type(e).__name__)
    with tempfile.TemporaryDirectory() as store:
        observer.to_store(store)
        result = replay.export(model, store, set_batch_dimension_for=True)
        print(f"replay.export ({label}): complete =", result.complete)
        for name, program in result.programs.items():
            print(f"  {name}:", forward_signature(program))
