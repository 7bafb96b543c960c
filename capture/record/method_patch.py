"""One method of an object replaced by a recorder's wrapper, and put back when it stops.

The one way capture wraps a method: `capture.record.recorder.Recorder` and
`capture.seeds.observer.InputObserver` both use it. Several wrappers may wrap the same method (a
model recorded twice, into two stores), stopped in any order: a wrapper left under another is
inactive (it passes calls through) and the one on top removes it with itself when it stops, so
no stale wrapper is left, whatever the order in which they stop.

Example:
    >>> class Model:
    ...     def forward(self, x):
    ...         return x + 1
    >>> model = Model()
    >>> patch = MethodPatch(model, "forward")
    >>> original = patch.current()
    >>> patch.install(original, lambda x: original(x) * 10)
    >>> model.forward(1)
    20
    >>> patch.restore()
    >>> model.forward(1), "forward" in vars(model)
    (2, False)
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["MethodPatch"]


class MethodPatch:
    """`owner.<method>` replaced by a wrapper while `active`.

    Attributes:
        owner: The object whose method is wrapped.
        method: The method's name.
        original: What ``owner.<method>`` was before (another recorder's wrapper, possibly).
        had_instance_attr: Whether that was an instance attribute (else the class's method).
        wrapper: The wrapper installed.
        active: True from `install` to `restore`: the wrapper records; else it passes through.
    """

    def __init__(self, owner: Any, method: str) -> None:
        self.owner = owner
        self.method = method
        self.original: Callable[..., Any] | None = None
        self.had_instance_attr = False
        self.wrapper: Callable[..., Any] | None = None
        self.active = False

    def current(self) -> Callable[..., Any]:
        """What ``owner.<method>`` is now (the method to wrap)."""
        method: Callable[..., Any] = getattr(self.owner, self.method)
        return method

    def install(self, original: Callable[..., Any], wrapper: Callable[..., Any]) -> None:
        """Sets `wrapper` as ``owner.<method>``; `original` is what it wraps (from `current`)."""
        self.original = original
        self.had_instance_attr = self.method in getattr(self.owner, "__dict__", {})
        wrapper._capture_patch = weakref.ref(self)  # type: ignore[attr-defined]
        self.wrapper = wrapper
        setattr(self.owner, self.method, wrapper)
        self.active = True

    def restore(self) -> None:
        """Puts back the method, unless another wrapper was set on top of ours since.

        Wrappers of patches restored while we were on top of them are skipped: ours removes
        them with itself.
        """
        self.active = False
        attrs = getattr(self.owner, "__dict__", {})
        if self.method in attrs and attrs[self.method] is not self.wrapper:
            return  # someone wrapped on top of us: they restore through us
        target, had = self.original, self.had_instance_attr
        while True:
            ref = getattr(target, "_capture_patch", None)
            below = ref() if ref is not None else None
            if below is None or below.active:
                break
            target, had = below.original, below.had_instance_attr
        if had:
            setattr(self.owner, self.method, target)
        else:
            try:
                delattr(self.owner, self.method)
            except AttributeError:
                setattr(self.owner, self.method, target)
