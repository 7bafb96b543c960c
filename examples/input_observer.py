"""InputObserver: recording inputs for torch.export (seeds 000 and 001).

`capture.InputObserver` replaces a model's forward method for the duration of a ``with`` block
and records how it is called. Afterwards:

* `infer_dynamic_shapes()` tells which tensor dimensions are dynamic across the observed calls;
* `infer_arguments()` builds one representative set of export arguments (with empty tensors for
  optional inputs that were missing in some calls).

Three scenarios, as in the seeds: positional args, keyword args, and an optional argument
(``mask``) that some calls do not pass, with ``value_if_missing``. The seeds end with a
matplotlib diagram of the workflow; matplotlib is not a dependency of this project, so the
diagram is left out. Section 4 runs the exports the seeds only show as code, and, where the
seed's own arguments cannot be exported (the empty ``mask`` of batch 0 does not broadcast with
``x``), goes through a capture store and `replay.export` instead.

Run: ``python examples/input_observer.py``
"""

import tempfile

import torch

import replay
from capture import InputObserver, string_type


def forward_signature(ep: torch.export.ExportedProgram) -> str:
    """The ``def forward(...)`` line of an exported program (its inputs and their shapes)."""
    return next(line.strip() for line in str(ep).splitlines() if "def forward(" in line)


# 1. Positional args: varying batch and sequence lengths ------------------------------------


class AddModel(torch.nn.Module):
    """Adds two tensors element-wise."""

    def forward(self, x, y):
        return x + y


model_add = AddModel()

# Three calls with different shapes: batch size and sequence length both vary.
inputs_add = [
    (torch.randn(2, 6), torch.randn(2, 6)),
    (torch.randn(3, 7), torch.randn(3, 7)),
    (torch.randn(4, 8), torch.randn(4, 8)),
]

observer_add = InputObserver()
with observer_add(model_add, store_n_calls=3):  # 3 is the default maximum
    for x, y in inputs_add:
        model_add(x, y)

print("Observations stored:", observer_add.num_obs())
assert observer_add.num_obs() == 3

dyn_add = observer_add.infer_dynamic_shapes()
print("Dynamic shapes:", dyn_add)

args_add = observer_add.infer_arguments()
print("Inferred args:", string_type(args_add, with_shape=True))

# 2. Keyword args: same model, named inputs -------------------------------------------------


class LinearModel(torch.nn.Module):
    """Applies a linear transformation: out = x @ W + b."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out_features, in_features))
        self.bias = torch.nn.Parameter(torch.zeros(out_features))

    def forward(self, x, labels=None):
        logits = x @ self.weight.T + self.bias
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits, labels)
            return logits, loss
        return logits


model_lin = LinearModel(8, 4)

# Three calls with varying batch size; sequence dim is absent here.
kwargs_lin = [
    dict(x=torch.randn(2, 8), labels=torch.randint(0, 4, (2,))),
    dict(x=torch.randn(5, 8), labels=torch.randint(0, 4, (5,))),
    dict(x=torch.randn(7, 8), labels=torch.randint(0, 4, (7,))),
]

observer_lin = InputObserver()
with observer_lin(model_lin):
    for kwargs in kwargs_lin:
        model_lin(**kwargs)

print("\nObservations stored (linear):", observer_lin.num_obs())

dyn_lin = observer_lin.infer_dynamic_shapes()
print("Dynamic shapes (linear):", dyn_lin)

kwargs_inferred = observer_lin.infer_arguments()
print("Inferred kwargs:", string_type(kwargs_inferred, with_shape=True))

# 3. Optional argument: mask present only in some calls -------------------------------------


class MaskedModel(torch.nn.Module):
    """Applies an optional multiplicative mask to the input."""

    def forward(self, x, mask=None):
        if mask is not None:
            return x * mask
        return x


model_masked = MaskedModel()

# Three calls: the first omits the mask, the other two include it.
seq_len = 10
inputs_masked = [
    dict(x=torch.randn(2, seq_len)),  # no mask
    dict(x=torch.randn(3, seq_len), mask=torch.ones(3, seq_len)),
    dict(x=torch.randn(4, seq_len), mask=torch.ones(4, seq_len)),
]

# When ``mask`` is absent, the observer uses an all-ones tensor with batch=0 (the zero batch
# dimension signals "optional") for the analysis; the model never receives it.
observer_masked = InputObserver(value_if_missing=dict(mask=torch.ones(0, seq_len)))

with observer_masked(model_masked):
    for kwargs in inputs_masked:
        model_masked(**kwargs)

print("\nObservations stored (masked):", observer_masked.num_obs())

dyn_masked = observer_masked.infer_dynamic_shapes()
print("Dynamic shapes (masked):", dyn_masked)

kwargs_masked = observer_masked.infer_arguments()
print("Inferred kwargs:", string_type(kwargs_masked, with_shape=True))

# 4. Using the results with torch.export.export ---------------------------------------------
print()
ep = torch.export.export(model_add, args_add, dynamic_shapes=dyn_add)
print("Exported (add):", forward_signature(ep))

ep = torch.export.export(model_lin, (), kwargs=kwargs_inferred, dynamic_shapes=dyn_lin)
print("Exported (linear):", forward_signature(ep))

# The seed's masked arguments pair x of batch 2 with a mask of batch 0: x * mask fails to
# trace, so torch.export cannot use them.
try:
    torch.export.export(model_masked, (), kwargs=kwargs_masked, dynamic_shapes=dyn_masked)
    print("Exported (masked) with the seed's arguments")
except Exception as e:  # the failure is the point of this step
    print("Exporting the masked model with the seed's arguments fails:", type(e).__name__)

# The export-safe path: write the observed calls into a store and let replay choose
# arguments whose dynamic dims are all >= 2 (one program per call group: with and without mask).
with tempfile.TemporaryDirectory() as store:
    observer_masked.to_store(store)
    result = replay.export(model_masked, store)
    print("replay.export (masked): complete =", result.complete)
    for name, program in result.programs.items():
        print(f"  {name}:", forward_signature(program))
