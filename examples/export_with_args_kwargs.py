"""Dynamic shapes for ``*args``, ``**kwargs`` (seed 003).

A quick tour of dynamic shapes with positional and named parameters, to see how
`torch.export.export` takes them. `replay.ModelInputs` guesses the dynamic shapes from two sets
of valid inputs (the dims that differ between them are dynamic), as a pair
``(positional_dynamic_shapes, keyword_dynamic_shapes)``; `ModelInputs.move_to_kwargs` moves the
positional ones to keyword arguments when a call mixes both. The seed ends with a legend image
drawn by its documentation helpers, left out here.

Run: ``python examples/export_with_args_kwargs.py``
"""

import pprint

import torch

from replay import ModelInputs

# args ------------------------------------------------------------------------------------------


class Model(torch.nn.Module):
    def forward(self, x, y):
        return x + y


model = Model()
x = torch.randn((5, 6))
y = torch.randn((1, 6))
model(x, y)  # to check it works

ep = torch.export.export(model, (x, y))
print(ep)

# As expected there is no dynamic shape. ModelInputs defines them from two sets of valid inputs,
# which must have different values for the dynamic dimensions.
inputs = [(x, y), (torch.randn((7, 8)), torch.randn((1, 8)))]
mi = ModelInputs(Model(), inputs)
ds = mi.guess_dynamic_shapes()
pprint.pprint(ds)

# A pair: the dynamic shapes of the positional arguments, then of the named ones (none here).
ep = torch.export.export(model, (x, y), dynamic_shapes=ds[0])
print(ep)

# kwargs ----------------------------------------------------------------------------------------


class Model(torch.nn.Module):
    def forward(self, x, y):
        return x + y


model = Model()
x = torch.randn((5, 6))
y = torch.randn((1, 6))
print(model(x=x, y=y))  # to check it works

inputs = [dict(x=x, y=y), dict(x=torch.randn((7, 8)), y=torch.randn((1, 8)))]
mi = ModelInputs(Model(), inputs)
ds = mi.guess_dynamic_shapes()
pprint.pprint(ds)

ep = torch.export.export(model, (), kwargs=dict(x=x, y=y), dynamic_shapes=ds[1])
print(ep)

# args and kwargs ---------------------------------------------------------------------------------
# torch.export.export does not take dynamic shapes for both args and kwargs: they must be given
# one way.


class Model(torch.nn.Module):
    def forward(self, x, y):
        return x + y


model = Model()
x = torch.randn((5, 6))
y = torch.randn((1, 6))
print(model(x, y=y))  # to check it works

inputs = [((x,), dict(y=y)), ((torch.randn((7, 8)),), dict(y=torch.randn((1, 8))))]
mi = ModelInputs(Model(), inputs)
ds = mi.guess_dynamic_shapes()
pprint.pprint(ds)

# move_to_kwargs uses the forward's signature to name the positional arguments.
new_args, new_kwargs, new_ds = mi.move_to_kwargs(*mi.inputs[0], ds)
pprint.pprint(new_ds)

ep = torch.export.export(model, new_args, kwargs=new_kwargs, dynamic_shapes=new_ds[1])
print(ep)
