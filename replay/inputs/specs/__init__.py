"""Shape facts learned from a store, in the forms compilers and runtimes ask for.

`facts` reads one call group's recorded sizes into per-symbol facts (range, the size to tune
for, a divisor every size shares, sizes 0 and 1); `shapesspec` writes them as torch's
``ShapesSpec`` (the object, and Python source for ``capture dims --python``); `additional`
builds a ``torch.export.AdditionalInputs``; `compilehints` prepares a module for
``torch.compile`` so that recorded traffic compiles once per call group.
"""
