"""`capture demo`: record a tiny causal LM serving a small workload, analyse it, export it.

The demo runs the whole loop on one machine in under a minute: it builds a tiny Llama from a
config in code (random weights, nothing downloaded), serves a mixed `generate()` workload with
`capture.Recorder` on, shows what the store learned through the same code as `capture summary`
and `capture dims`, exports the decode step with `replay.export` from the recordings, and prints
the coverage table. torch and transformers are imported inside the command only.
"""

from __future__ import annotations

import shlex
import time
from typing import Any

import click

from capture import check_folder

from .fit import Fit, terminal_width, wide_option
from .main import store_path
from .output import table_text, write_text

__all__ = [
    "demo_command",
    "DEMO_MODEL",
    "WORKLOAD",
    "MAX_NEW_TOKENS",
    "EXPORT_GROUP",
    "EXIT_PARTIAL",
]

DEMO_MODEL = "tiny-llama"
"""The `model` name the demo records under."""

WORKLOAD: tuple[tuple[int, int], ...] = (
    (1, 5),
    (2, 7),
    (4, 12),
    (1, 9),
    (3, 6),
    (2, 16),
    (4, 5),
    (1, 3),
)
"""(batch size, prompt length) of each `generate()` request; batches of 2+ are left-padded."""

MAX_NEW_TOKENS = 8
"""Tokens generated per request: one prefill call and MAX_NEW_TOKENS - 1 decode calls each."""

EXPORT_GROUP = "decode"
"""The call group the demo exports: generate()'s decode step with a padded batch (mask passed)."""

EXIT_PARTIAL = 3
"""Exit status when the export does not cover every recorded signature (STYLE: exit codes)."""

# $CAPTURE_STORE is a default: `capture demo --store X` overrides it without a conflict.
_EXPLICIT = (click.core.ParameterSource.COMMANDLINE,)


def _step(number: int, total: int, text: str) -> float:
    """Writes one progress line to stderr; returns the start time of the step."""
    click.echo(f"[{number}/{total}] {text}", err=True)
    return time.perf_counter()


def _done(start: float, text: str = "done") -> None:
    click.echo(f"      {text} ({time.perf_counter() - start:.1f} s)", err=True)


def _section(title: str, note: str, body: str) -> None:
    write_text(f"\n== {title} ==\n{note}\n{body}")


INCOMPLETE = ".demo-incomplete"
"""Marker file a demo keeps in its store until it has run to its end: a demo interrupted (Ctrl-C)
or failed at any step, the export included, leaves it, and the next demo replaces that
recording."""


def _remove_interrupted(store: str) -> None:
    """Deletes the recording of a demo that was interrupted (its marker file is present)."""
    import pyarrow.fs as pafs

    from capture import resolve_store, schema

    try:
        fs, root = resolve_store(store)
        marked = fs.get_file_info(f"{root}/{INCOMPLETE}").type == pafs.FileType.File
    except Exception:  # an unopenable store: open_store says why, in one line
        return
    if not marked:
        return
    click.echo(f"note: replacing the recording of an interrupted demo in {store}", err=True)
    for table in schema.TABLES:
        folder = f"{root}/{table}/model={DEMO_MODEL}"
        if fs.get_file_info(folder).type == pafs.FileType.Directory:
            fs.delete_dir(folder)
    fs.delete_file(f"{root}/{INCOMPLETE}")


def _mark(store: str, incomplete: bool) -> None:
    """Creates (before recording) or removes (once recorded) the `INCOMPLETE` marker."""
    from capture import resolve_store

    fs, root = resolve_store(store)
    if incomplete:
        fs.create_dir(root, recursive=True)
        with fs.open_output_stream(f"{root}/{INCOMPLETE}") as f:
            f.write(b"a capture demo is recording here; if none runs, the next demo replaces it\n")
    else:
        fs.delete_file(f"{root}/{INCOMPLETE}")


def _nothing_at(store: str) -> bool:
    """Whether nothing (no file, no folder) is at `store` yet."""
    import pyarrow.fs as pafs

    from capture import resolve_store

    try:
        fs, root = resolve_store(store)
        return bool(fs.get_file_info(root).type == pafs.FileType.NotFound)
    except (OSError, ValueError):  # unreachable or malformed: open_store's message says why
        return False


def _check_store(store: str) -> None:
    """Refuses a store that already holds a demo recording (the demo would double it)."""
    from capture import EmptyStore, StoreNotFound, open_store

    _remove_interrupted(store)
    try:
        with open_store(store) as opened:
            models = opened.models()
    except EmptyStore:
        return
    except StoreNotFound:
        if _nothing_at(store):  # a new store: the demo creates it
            return
        raise  # a file, a folder inside a store, an unreachable endpoint: the reader says which
    if DEMO_MODEL in models:
        raise click.ClickException(
            f"the store at {store} already holds a {DEMO_MODEL} recording from an earlier demo; "
            f"remove it or pass another store, e.g. capture demo --store /tmp/capture-demo"
        )


def _record(store: str) -> Any:
    """Builds the tiny Llama and serves WORKLOAD through generate() with the recorder on."""
    from capture import Recorder, demo_model

    start = _step(1, 4, "building a tiny Llama causal LM from a config (random weights)")
    model = demo_model.tiny_llama(seed=0)
    _done(start)
    requests = ", ".join(f"{b}x{n}" for b, n in WORKLOAD)
    start = _step(
        2,
        4,
        f"serving {len(WORKLOAD)} generate() requests with capture.Recorder on, "
        f"{MAX_NEW_TOKENS} new tokens each\n      (batch x prompt length: {requests})",
    )
    recorder = Recorder(model, store, name=DEMO_MODEL)
    with recorder:
        demo_model.run_generate(model, WORKLOAD, max_new_tokens=MAX_NEW_TOKENS)
    stats = recorder.stats()
    _done(start, f"{stats['recorded']} forward calls recorded, {stats['dropped']} dropped")
    return model


def _show_analysis(store: Any, width: int | None) -> None:
    """Prints the `capture summary` report, then the exported group's dynamic dims per axis."""
    from .summary_table import summary_report

    start = _step(3, 4, f"analysing the store with DuckDB ({store.path})")
    summary = store.summary(DEMO_MODEL)
    dims = store.dims(DEMO_MODEL)
    _done(start)
    write_text(summary_report(summary, width))
    columns = ["path", "axis", "min", "max", "distinct", "symbol", "expr"]
    rows = [
        row
        for row in dims.select(["group", "dynamic", *columns]).to_pylist()
        if row["group"] == EXPORT_GROUP and row["dynamic"]
    ]
    _section(
        f"Dynamic dims of the {EXPORT_GROUP} group (capture dims)",
        "One row per input axis whose size varies.",
        table_text(
            [{c: row[c] for c in columns} for row in rows], fit=Fit(width, keep_end=("path",))
        ),
    )


def _export(model: Any, store: Any, signatures: bool, width: int | None) -> bool:
    """Exports the decode step from the store and prints its coverage and the total line."""
    import replay

    start = _step(
        4,
        4,
        f"exporting the {EXPORT_GROUP} step with torch.export, then running it on every "
        "recorded signature",
    )
    result = replay.export(model, store, model_name=DEMO_MODEL, groups=[EXPORT_GROUP])
    _done(start)
    for note in result.notes:
        click.echo(f"      note: {note}", err=True)
    checked = (
        "The program run on every recorded signature and on probes (unseen sizes inside the\n"
        "recorded ranges), compared with eager"
    )
    if signatures:
        note, table = f"{checked}: one row each.", result.coverage
    else:
        note = f"{checked}; covered/total per group (--signatures: one row each)."
        table = replay.group_coverage(result.coverage)
    _section(
        f"Export of the {EXPORT_GROUP} group (capture export)",
        note,
        table_text(table, fit=Fit(width)),
    )
    write_text(replay.coverage_total(result.coverage))
    return bool(result.complete)


def _next_steps(store: str) -> None:
    where = shlex.quote(store)
    write_text(
        "\n".join(
            [
                "",
                f"The store is at {store}. Try:",
                f"  capture --store {where} summary",
                f"  capture --store {where} dims --python",
                f'  capture --store {where} query "SELECT path, shape FROM leaves LIMIT 8"',
                f"  capture --store {where} report --out report.html",
                f"  capture --store {where} export capture.demo_model:tiny_llama --group prefill",
            ]
        )
    )


@click.command("demo")
@click.option(
    "--store",
    "store_option",
    metavar="PATH",
    default=None,
    help="Where to record: a directory or a pyarrow filesystem URI. Default: the global --store "
    "($CAPTURE_STORE if set, else ./capture-store).",
)
@click.option(
    "--signatures",
    is_flag=True,
    default=False,
    help="Print the export's full coverage table, one row per recorded signature and probe. "
    "Default: one row per group, then the total line.",
)
@wide_option
@click.pass_context
def demo_command(
    ctx: click.Context, store_option: str | None, signatures: bool, wide: bool
) -> None:
    """Record a tiny model into a store to try the commands.

    Builds a tiny Llama causal LM from a config in code (random weights, nothing is
    downloaded), serves a few generate() requests of several batch sizes and prompt
    lengths with capture.Recorder on, shows what the store learned (call groups,
    dynamic dims with their ranges, shared dims and relations), exports the decode
    step with torch.export from the recordings and checks it on every recorded
    signature. Takes well under a minute on a laptop CPU. Progress goes to stderr.

    Exit status: 0 when the export covers every recorded signature, 3 when it
    covers only part of them, 1 when the store already holds a finished demo
    recording or cannot be written. A demo that did not run to its end (Ctrl-C)
    is replaced by the next one.

    \b
    Example:
      capture demo
      capture demo --store /tmp/capture-demo
      capture --store /tmp/capture-demo summary
    """
    store = _resolve_store(ctx, store_option)
    check_folder(store, option="--store", what="store")  # read-only, full: before any work
    _check_store(store)
    # Until the demo has run to its end (analysis and export included), the marker says the
    # recording is unfinished: after Ctrl-C or a failure, the next demo replaces it.
    _mark(store, incomplete=True)
    model = _record(store)

    from capture import open_store

    width = terminal_width(wide)
    with open_store(store) as opened:
        _show_analysis(opened, width)
        complete = _export(model, opened, signatures, width)
    _mark(store, incomplete=False)
    _next_steps(store)
    if not complete:
        ctx.exit(EXIT_PARTIAL)


def _resolve_store(ctx: click.Context, store_option: str | None) -> str:
    """The demo's --store, or the global one; both given and different is a usage error."""
    global_store = store_path(ctx)
    if store_option is None:
        return global_store
    parent = ctx.parent
    if (
        parent is not None
        and parent.get_parameter_source("store") in _EXPLICIT
        and global_store != store_option
    ):
        raise click.UsageError(
            f"two stores given: capture --store {global_store} and demo --store {store_option}; "
            "pass only one"
        )
    return store_option
