"""The process-wide state torch.export sets, put back after an export stopped at its deadline.

Read before each export bounded in time and compared after one stopped at its deadline
(`replay.pipeline.budget.deadline`).

torch.export sets global state for the time it traces and restores it on the way out: modes on
the dispatch and function-mode stacks, dispatch-key thread-locals, dynamo's frame callback,
config flags (``torch._dynamo.config``, ``torch._functorch.config``, ...), flags of
``torch.compiler`` and ``torch.fx``, ``builtins.max``/``min`` and ``math.pow`` (non-strict
export replaces them), backend flags (mkldnn, nnpack, cudnn, the TorchScript fuser), and the
exported module's own attributes (its parameters are swapped for fake tensors, its ``forward``
patched). Each is restored by a ``with`` block or a ``finally`` clause, which run when the
deadline's exception unwinds the export; the deadline never stops the export inside an
``__enter__``/``__exit__`` (`replay.pipeline.budget.deadline`). `TorchState` is the check of
what the unwinding left: read before the export, compared after it, and whatever differs is put
back and named (the caller logs it).

Private APIs (checked on torch 2.13.0; each read is skipped where this torch lacks it):
``torch._C._len_torch_dispatch_stack``/``_pop_torch_dispatch_stack``, the same for the
function-mode stack, ``torch._C._dispatch_tls_local_include_set``/``exclude_set`` and
``_dispatch_tls_set_dispatch_key_included``/``excluded``,
``torch._C._dynamo.eval_frame.get_eval_frame_callback``/``set_eval_frame``, the config modules'
``get_config_copy``, and the module attributes listed in ``_ATTRIBUTES``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

__all__ = ["TorchState"]

_ATTRIBUTES = (
    ("builtins", "max"),
    ("builtins", "min"),
    ("math", "pow"),
    ("torch.compiler", "_is_compiling_flag"),
    ("torch.compiler", "_is_exporting_flag"),
    ("torch._export.utils", "_DISABLE_ATEN_TO_ASSERTION_PASS"),
    ("torch.fx._symbolic_trace", "_is_fx_tracing_flag"),
    ("torch.fx.experimental.proxy_tensor", "_CURRENT_MAKE_FX_TRACER"),
    ("torch.fx.traceback", "should_preserve_node_meta"),
    ("torch.fx.traceback", "current_meta"),
)
"""``(module, attribute)`` that torch.export sets for the time it runs (read where loaded)."""

_CONFIGS = (
    "torch._dynamo.config",
    "torch._functorch.config",
    "torch._export.config",
    "torch.fx.experimental._config",
    "torch._inductor.config",
)
"""Config modules torch.export patches (``config.patch``), read where already imported."""

_FLAGS = (
    ("grad", "is_grad_enabled", "_set_grad_enabled"),
    ("mkldnn", "_get_mkldnn_enabled", "_set_mkldnn_enabled"),
    ("nnpack", "_get_nnpack_enabled", "_set_nnpack_enabled"),
    ("cudnn", "_get_cudnn_enabled", "_set_cudnn_enabled"),
    ("texpr fuser", "_jit_texpr_fuser_enabled", "_jit_set_texpr_fuser_enabled"),
)
"""``(name, getter, setter)`` of boolean flags in ``torch._C``."""


@dataclass(frozen=True)
class _Item:
    """One piece of state: its value when read, and how to put that value back."""

    value: Any
    restore: Callable[[], None]


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values that do not compare are not the same
        return False


def _read(module: torch.nn.Module | None) -> dict[str, _Item]:
    items: dict[str, _Item] = {}
    c = torch._C
    for name, getter, setter in _FLAGS:
        get, set_ = getattr(c, getter, None), getattr(c, setter, None)
        if get is not None and set_ is not None:
            value = bool(get())
            items[f"flag {name}"] = _Item(value, partial(set_, value))
    for stack, length, pop in (
        ("dispatch", "_len_torch_dispatch_stack", "_pop_torch_dispatch_stack"),
        ("function", "_len_torch_function_stack", "_pop_torch_function_stack"),
    ):
        size, popper = getattr(c, length, None), getattr(c, pop, None)
        if size is not None and popper is not None:
            n = int(size())
            items[f"torch {stack}-mode stack"] = _Item(n, partial(_pop_to, size, popper, n))
    items.update(_dispatch_keys())
    frames = getattr(getattr(c, "_dynamo", None), "eval_frame", None)
    if frames is not None and hasattr(frames, "get_eval_frame_callback"):
        callback = frames.get_eval_frame_callback()
        items["dynamo frame callback"] = _Item(callback, partial(frames.set_eval_frame, callback))
    for home, attribute in _ATTRIBUTES:
        owner = sys.modules.get(home)
        if owner is not None and hasattr(owner, attribute):
            value = getattr(owner, attribute)
            items[f"{home}.{attribute}"] = _Item(value, partial(setattr, owner, attribute, value))
    for home in _CONFIGS:
        config = sys.modules.get(home)
        copy = getattr(config, "get_config_copy", None)
        if copy is not None:
            values = copy()
            items[home] = _Item(values, partial(_restore_config, config, values))
    if module is not None:
        items.update(_module_items(module))
    return items


def _pop_to(size: Callable[[], int], pop: Callable[[], Any], n: int) -> None:
    while size() > n:
        pop()


def _dispatch_keys() -> dict[str, _Item]:
    c = torch._C
    names = (
        "_dispatch_tls_local_include_set",
        "_dispatch_tls_local_exclude_set",
        "_dispatch_tls_is_dispatch_key_included",
        "_dispatch_tls_is_dispatch_key_excluded",
        "_dispatch_tls_set_dispatch_key_included",
        "_dispatch_tls_set_dispatch_key_excluded",
    )
    if not all(hasattr(c, n) for n in names):
        return {}
    items: dict[str, _Item] = {}
    for side in ("include", "exclude"):
        value = str(getattr(c, f"_dispatch_tls_local_{side}_set")())
        ed = "included" if side == "include" else "excluded"
        keys = {
            key: bool(getattr(c, f"_dispatch_tls_is_dispatch_key_{ed}")(key))
            for key in c.DispatchKey.__members__.values()
        }
        setter = getattr(c, f"_dispatch_tls_set_dispatch_key_{ed}")
        items[f"dispatch keys {ed}"] = _Item(value, partial(_set_keys, setter, keys))
    return items


def _set_keys(setter: Callable[[Any, bool], None], keys: dict[Any, bool]) -> None:
    for key, on in keys.items():
        try:
            setter(key, on)
        except (RuntimeError, ValueError):  # an alias key has no bit of its own
            continue


def _restore_config(config: Any, values: dict[str, Any]) -> None:
    now = config.get_config_copy()
    for key, value in values.items():
        if not _same(now.get(key), value):
            setattr(config, key, value)


def _module_items(module: torch.nn.Module) -> dict[str, _Item]:
    """Every sub-module's parameters, buffers, children and own ``forward``, by identity."""
    items: dict[str, _Item] = {}
    for path, sub in module.named_modules(remove_duplicate=True):
        for table in ("_parameters", "_buffers", "_modules"):
            entries = dict(getattr(sub, table))
            items[f"module {path or '<root>'} {table}"] = _Item(
                tuple((k, id(v)) for k, v in entries.items()),
                partial(_restore_table, sub, table, entries),
            )
        forward = sub.__dict__.get("forward")
        items[f"module {path or '<root>'} forward"] = _Item(
            id(forward) if forward is not None else None,
            partial(_restore_forward, sub, forward),
        )
    return items


def _restore_table(module: torch.nn.Module, table: str, entries: dict[str, Any]) -> None:
    current = getattr(module, table)
    current.clear()
    current.update(entries)


def _restore_forward(module: torch.nn.Module, forward: Any) -> None:
    if forward is None:
        module.__dict__.pop("forward", None)
    else:
        module.__dict__["forward"] = forward


@dataclass(frozen=True)
class TorchState:
    """The process-wide state torch.export sets (module docstring), read at one moment.

    Example:
        >>> before = TorchState.read(model)  # doctest: +SKIP
        >>> # ... an export stopped at its deadline ...
        >>> before.restore()  # what differed, put back  # doctest: +SKIP
        []
    """

    items: dict[str, _Item]
    module: torch.nn.Module | None

    @classmethod
    def read(cls, module: torch.nn.Module | None = None) -> TorchState:
        """The state now, with `module`'s own attributes (the module being exported)."""
        return cls(_read(module), module)

    def changed(self) -> list[str]:
        """The names of what differs now from when this was read."""
        now = _read(self.module)
        return [
            name
            for name, item in self.items.items()
            if name not in now or not _same(now[name].value, item.value)
        ]

    def restore(self) -> list[str]:
        """Puts back what differs now from when this was read; returns what it put back."""
        names = self.changed()
        for name in names:
            self.items[name].restore()
        return names
