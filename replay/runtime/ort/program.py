"""One ONNX file of a set served: a call's tensors fed to its session, its outputs returned.

`replay.runtime.ort.runner` routes a call to the file's `OnnxProgram`:

- **feeds**: the call's tensors given to the file's inputs, by recorded leaf path (`run`) or,
  the order made once per entry, by their place among the call's tensors (`run_at`); numpy
  arrays over the tensors' memory, or DLPack OrtValues for an element type numpy lacks;
- **outputs**: the ONNX outputs (and the program's constant outputs) put back into the
  program's output treespec, parsed by `capture.pytree.treespec`, by a builder made at the
  first call (`capture.pytree.unflatten`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import methodcaller
from typing import Any

from replay.runtime.guards import CallNotServed
from replay.runtime.ort.combined import Branch
from replay.runtime.ort.manifest import OnnxFile

__all__ = ["OnnxProgram"]


_NUMPY_LACKS = ("bfloat16", "float8", "float4", "int4", "int2", "complex32")
"""Element types (manifest dtypes, onnxruntime's ``tensor(...)`` names) numpy has no type for."""


_numpy = methodcaller("numpy")
"""``Tensor.numpy`` (without importing torch)."""


def _ort_value(t: Any) -> Any:
    """An onnxruntime OrtValue over a CPU tensor's memory (DLPack, no copy)."""
    from onnxruntime.capi import _pybind_state as C

    return C.OrtValue.from_dlpack(t.__dlpack__())


def _plain(t: Any) -> Any:
    """`t` as a plain tensor: detached, on the CPU, its lazy conjugate and negation applied,
    contiguous (a copy where it was not all of these)."""
    return t.detach().cpu().resolve_conj().resolve_neg().contiguous()


class OnnxProgram:
    """One ONNX file of a set: its session and how a call's tensors feed it.

    Attributes:
        name: The program's name (the group that owns the file).
        file: The ONNX fields of the owning group's entry (the file's inputs and outputs:
            every entry the file serves names them).
        session: Its ``onnxruntime.InferenceSession``: the set's one session (the file is one
            branch of the combined model, `branch`) or the file's own.
        branch: Where the file lives in the combined model (None: the session is the file's).
    """

    def __init__(
        self, name: str, file: OnnxFile, session: Any, branch: Branch | None = None
    ) -> None:
        self.name = name
        self.file = file
        self.session = session
        self.branch = branch
        inputs = branch.inputs if branch else {i.name: i.name for i in file.inputs}
        outputs = branch.outputs if branch else {n: n for n in file.outputs.names if n}
        self._inputs = [(inputs[i.name], i.path) for i in file.inputs]
        self._names_in = [name for name, _ in self._inputs]
        self._names = list(file.outputs.names)
        self._constants = list(file.outputs.constants)
        self._fetch = [outputs[n] for n in self._names if n is not None]
        # the constant outputs by their place among the leaves, inserted in that order
        self._constant_at = [
            (i, constant)
            for i, (name, constant) in enumerate(zip(self._names, self._constants, strict=True))
            if name is None
        ]
        # Feeds and outputs go as numpy arrays over the tensors' memory (onnxruntime's plain
        # `run`, no copy either way: its outputs' arrays keep its buffers), or, for an element
        # type numpy lacks (bfloat16, float8, int4), as DLPack OrtValues.
        types = {o.name: o.type for o in session.get_outputs()}
        self._numpy = not any(
            lacking in text
            for text in [*(i.dtype for i in file.inputs), *(types.get(n, "") for n in self._fetch)]
            for lacking in _NUMPY_LACKS
        )
        # a tensor as onnxruntime takes it: a numpy array, or an OrtValue where numpy lacks
        # the element type
        self._feed = self._array if self._numpy else self._dlpack
        # the file's branch runs; the others' flags keep their default, false
        self._flags: dict[str, Any] = {branch.flag: self._true()} if branch else {}
        self._spec: Any = None
        # the output builder, made at the first call (`capture.pytree.unflatten`)
        self._build: Any = None
        self._from_numpy: Any = None  # ``torch.from_numpy``, once a call has run

    def _true(self) -> Any:
        """A true flag, fed as this file's feeds are (a numpy array or a C-level OrtValue)."""
        import numpy as np

        flag = np.array(True)
        if self._numpy:
            return flag
        import onnxruntime as ort

        # kept: the C-level value lives as long as this Python OrtValue
        self._flag = ort.OrtValue.ortvalue_from_numpy(flag)
        return self._flag._ortvalue

    def _treespec(self) -> Any:
        if self._spec is None:
            from capture.pytree.treespec import parse, to_treespec

            source = f"the outputs of {self.file.file}"
            self._spec = to_treespec(parse(self.file.outputs.spec, source), source)
        return self._spec

    def run(self, tensors: Mapping[str, Any]) -> Any:
        """Runs the file on a call's tensors, by their recorded leaf path.

        Returns:
            The output, in the program's output structure (eager's types).

        Raises:
            CallNotServed: The call lacks an input of the file, or onnxruntime refused it.
        """
        feeds = dict(self._flags)
        label = self.name
        feed = self._feed
        for name, path in self._inputs:
            t = tensors.get(path)
            if t is None:
                reason = f"the call has no {path} for the file's input {name}"
                raise CallNotServed(f"program {label}: {reason}", {label: reason})
            feeds[name] = feed(t)
        return self._answer(feeds)

    def feed_order(self, paths: Sequence[str]) -> tuple[int, ...] | None:
        """Where each input of the file is among a call's tensors whose recorded leaf paths are
        `paths` (what `run_at` takes); None when one is not among them (`run` says which)."""
        at = {path: i for i, path in enumerate(paths)}
        if any(path not in at for _, path in self._inputs):
            return None
        return tuple(at[path] for _, path in self._inputs)

    def run_at(self, tensors: Sequence[Any], pick: Callable[[Sequence[Any]], Sequence[Any]]) -> Any:
        """`run` on a call's tensors in leaf order, the file's inputs taken by `pick`
        (`replay.runtime.runner.picker` of `feed_order`, made once per entry)."""
        picked = pick(tensors)
        if not self._numpy:
            feeds = dict(zip(self._names_in, map(self._dlpack, picked), strict=True))
        else:
            try:  # one C-level pass for the common case (`_array`)
                feeds = dict(zip(self._names_in, map(_numpy, picked), strict=True))
            except (RuntimeError, TypeError):
                feeds = dict(zip(self._names_in, map(self._array, picked), strict=True))
        if self._flags:
            feeds.update(self._flags)
        return self._answer(feeds)

    @staticmethod
    def _array(t: Any) -> Any:
        """A tensor as a numpy array over its memory. ``Tensor.numpy`` refuses a tensor that
        needs grad, lives elsewhere than the CPU or has a lazy conjugate or negation bit: those
        are copied first. A strided one is taken as it is: onnxruntime copies a non-contiguous
        array into a contiguous one itself. One call for the common case, where checking the
        tensor's properties first cost as much as the conversion."""
        try:
            return t.numpy()
        except (RuntimeError, TypeError):
            return _plain(t).numpy()

    def _dlpack(self, t: Any) -> Any:
        """A tensor as a DLPack OrtValue over a plain contiguous CPU tensor's memory (a copy
        only where it is not one). DLPack carries no conjugate or negation bit: it exports a
        lazily negated tensor's memory as it is, the negation lost, so such a tensor is
        resolved first."""
        if t.requires_grad or not t.is_cpu or not t.is_contiguous() or t.is_neg() or t.is_conj():
            t = _plain(t)
        return _ort_value(t)

    def _answer(self, feeds: dict[str, Any]) -> Any:
        """Runs the session on `feeds`; the output tree (eager's types)."""
        label = self.name
        from_numpy = self._from_numpy
        if from_numpy is None:  # torch is imported by then: the call's tensors are its
            import torch

            from_numpy = self._from_numpy = torch.from_numpy
        try:
            if self._numpy:
                arrays = self.session._sess.run(self._fetch, feeds, None)
                values = list(map(from_numpy, arrays))
            else:
                import torch

                got = self.session._sess.run_with_ort_values(feeds, self._fetch, None)
                values = got.to_dlpacks(torch._C._from_dlpack)
        except Exception as e:  # onnxruntime's Fail / InvalidArgument: the file refused the call
            text = str(e).strip().splitlines()
            reason = f"onnxruntime refused the call: {type(e).__name__}: {text[0] if text else ''}"
            raise CallNotServed(f"group {label} matched, but {reason}", {label: reason}) from e
        if self._constant_at:  # the program's constant outputs go between the files' outputs
            values = list(values)
            for i, constant in self._constant_at:
                values.insert(i, constant)
        if self._build is None:
            from capture.pytree.unflatten import builder

            self._build, tree = builder(self._treespec(), values)
            return tree
        return self._build(values)
