"""The installed package, checked as a user meets it: every module, the command, the whole story.

    python tools/wheel_check.py WORKDIR

Run it with the Python of an environment where the built wheel is installed (not the checkout:
`.ci/run` builds the wheel, installs it into a fresh virtual environment and runs this script
from outside the repository). It fails, naming what broke, unless:

- ``capture`` and ``replay`` are imported from site-packages, not from a checkout;
- every module of both packages imports (``pkgutil.walk_packages``): a package the wheel lacks
  fails here, as a user's first ``replay.export`` would;
- ``capture --version`` and ``python -m capture.cli --version`` print the installed version;
- a tiny Llama (``capture.demo_model``, random weights) records a ``generate()`` workload, is
  exported with ``replay.export``, saved, loaded with ``replay.load`` and serves every ORIGINAL
  call it received (kept by a forward pre-hook) with eager's answer within the export's
  tolerance; ``capture check`` on the saved artifact exits 0.

One JSON object on stdout: the versions, the module count and the served calls.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

# The script's own folder is on sys.path when run as a file: nothing of the checkout may be.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() not in (_HERE, _HERE.parent)]

WORKLOAD = ((1, 5), (2, 7), (1, 9))


def _fail(what: str) -> None:
    print(f"wheel check: {what}", file=sys.stderr)
    raise SystemExit(1)


def _modules() -> list[str]:
    """Imports every module of capture and replay; returns their names."""
    names: list[str] = []
    for top in ("capture", "replay"):
        package = importlib.import_module(top)
        where = Path(package.__file__ or "").parent
        if "site-packages" not in where.parts:
            _fail(f"{top} is imported from {where}, not from an installed wheel")
        names.append(top)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{top}."):
            try:
                importlib.import_module(info.name)
            except ImportError as error:
                _fail(f"{info.name} does not import from the wheel: {error}")
            names.append(info.name)
    return names


def _command(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        _fail(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout.strip()


def _leaves(value: Any) -> list[Any]:
    import torch
    import torch.utils._pytree as pytree

    import capture

    with capture.register_flattening_functions():
        return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _story(work: Path) -> dict[str, int]:
    """Records, exports, saves, loads and serves the original calls; `capture check` agrees."""
    import torch

    import capture
    import replay
    from capture.demo_model import run_generate, tiny_llama

    model = tiny_llama()
    originals: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kwargs: originals.append(copy.deepcopy((tuple(args), dict(kwargs)))),
        with_kwargs=True,
    )
    store = work / "store"
    with capture.Recorder(model, store, name="llama"):
        run_generate(model, WORKLOAD)
    hook.remove()

    result = replay.export(model, store, model_name="llama")
    artifact = work / "llama.pt2"
    result.save(artifact)
    runner = replay.load(artifact)
    served = 0
    with torch.no_grad():
        for args, kwargs in originals:
            expected = _leaves(model(*copy.deepcopy(args), **copy.deepcopy(kwargs)))
            got = _leaves(runner(*args, **kwargs))
            if len(got) != len(expected) or not all(
                a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4)
                for a, b in zip(expected, got, strict=True)
            ):
                _fail("the loaded artifact answered an original call unlike eager")
            served += 1
    _command("capture", "--store", str(store), "check", str(artifact))
    return {"calls": len(originals), "served": served}


def main() -> None:
    if len(sys.argv) != 2:
        _fail("usage: python tools/wheel_check.py WORKDIR")
    work = Path(sys.argv[1])
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    import torch

    import capture

    modules = _modules()
    version = f"capture {capture.__version__}"
    for argv in (("capture", "--version"), (sys.executable, "-m", "capture.cli", "--version")):
        if _command(*argv) != version:
            _fail(f"{' '.join(argv)} does not print {version!r}")
    story = _story(work)
    print(
        json.dumps(
            {"capture": capture.__version__, "torch": torch.__version__, "modules": len(modules)}
            | story
        )
    )


if __name__ == "__main__":
    main()
