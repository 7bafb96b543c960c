"""The `capture` command group: global options, lazy command registry, error and warning policy.

Commands are registered by name as ``"module:function"`` and imported only when they run or
when their own ``--help`` is shown, so ``capture --help`` imports neither torch nor duckdb, and
a command whose module fails to import (a missing optional dependency) leaves the others usable.

Policy applied to every command, in one place (`CaptureGroup.invoke`):

- Ctrl-C ends the command with one line ``Error: interrupted (Ctrl-C)`` and exit status 130;
- a closed stdout (``capture query ... | head`` read what it needed) ends the command quietly,
  with exit status 141 (128 + SIGPIPE), as a program that SIGPIPE ended;
- ``--store`` given after the command is a usage error that says to put it first;
- a `capture.errors.CaptureError` becomes a `click.ClickException`: one line ``Error: ...`` on
  stderr, exit status 1, no traceback (multi-line library messages, such as DuckDB's caret
  diagnostics, are folded into that line);
- warnings whose message starts with ``capture:`` (e.g. the store skipping a truncated Parquet
  file) are always shown, and every shown warning is one line ``warning: <message>`` on stderr,
  whatever the interpreter's warning filters say about ``capture:`` warnings;
- log records of level WARNING and above from the ``capture``, ``replay`` and ``cli`` loggers
  are written the same way (``warning: ...``, ``error: ...``), one line each.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

import click

from capture import CaptureError, printable

__all__ = ["cli", "CaptureGroup", "Settings", "store_path", "COMMANDS", "DEFAULT_STORE"]

DEFAULT_STORE = "./capture-store"
"""Store used when neither ``--store`` nor ``$CAPTURE_STORE`` is given."""

STORE_ENVVAR = "CAPTURE_STORE"

EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as shells report it."""

EXIT_BROKEN_PIPE = 141
"""Exit status when stdout's reader went away (``capture query ... | head``): 128 + SIGPIPE,
what a shell reports for a program the signal ended."""

COMMANDS: dict[str, tuple[str, str]] = {
    "query": (".query:query_command", "Run SQL over the recorded calls and print the result."),
    "summary": (".query:summary_command", "Summarize what the store recorded, per model."),
    "dims": (".query:dims_command", "Show which input dimensions are dynamic, per model."),
    "export": (
        ".export:export_command",
        "Export a model with torch.export using the recorded calls.",
    ),
    "compact": (
        ".compact:compact_command",
        "Merge the store's small Parquet files into big ones.",
    ),
    "payloads": (
        ".payloads:payloads_command",
        "List or delete the real calls kept with Recorder(payloads=...).",
    ),
    "demo": (".demo:demo_command", "Record a tiny model into a store to try the commands."),
    "report": (
        ".report:report_command",
        "Write an HTML page with plots of the store's traffic.",
    ),
    "profiles": (
        ".engines:profiles_command",
        "Print TensorRT min/opt/max shape profiles per call group.",
    ),
    "hints": (
        ".hints:compile_hints_command",
        "Print torch.compile dynamic marks per call group, as JSON.",
    ),
    "buckets": (
        ".engines:buckets_command",
        "Choose the N batch or sequence sizes that pad recorded calls least.",
    ),
    "check": (
        ".check:check_command",
        "Check that a saved artifact serves the calls recorded in the store.",
    ),
}
"""Command name -> (``"module:function"``, one-line summary shown by ``capture --help``).

The summary is kept here so that listing commands imports none of them; a test checks that it
matches the first line of each command's own help.
"""


@dataclass(frozen=True)
class Settings:
    """Global options, stored as the click context object (``ctx.obj``) for every command."""

    store: str


def store_path(ctx: click.Context) -> str:
    """The store chosen with ``--store`` / ``$CAPTURE_STORE`` for the running command.

    Args:
        ctx: The command's click context (or any descendant of the group's).

    Returns:
        The store path or URI; `DEFAULT_STORE` when the command runs outside the group.

    Example:
        >>> @click.command()
        ... @click.pass_context
        ... def show(ctx: click.Context) -> None:
        ...     click.echo(store_path(ctx), err=True)
    """
    settings = ctx.find_object(Settings)
    if settings is not None:
        return settings.store
    return os.environ.get(STORE_ENVVAR) or DEFAULT_STORE


def _one_line(message: str) -> str:
    """Folds a multi-line message into one line; drops blank lines and caret markers; escapes
    what is left of control characters (`capture.untrusted.printable`: a message may name
    what a store holds)."""
    lines = [line.strip() for line in message.splitlines()]
    lines = [line for line in lines if line and set(line) != {"^"}]
    if not lines:
        return printable(message.strip())
    if len(lines) == 1:
        return printable(lines[0])
    return printable(f"{lines[0]} ({'; '.join(lines[1:])})")


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    click.echo(f"warning: {_one_line(str(message))}", err=True)


class _StderrHandler(logging.Handler):
    """Writes a log record as ``<level>: <message>`` on the current stderr (click's)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = _one_line(record.getMessage())
            click.echo(f"{record.levelname.lower()}: {message}", err=True)
        except Exception:  # logging must never break the command; the stdlib convention
            self.handleError(record)


_LOGGERS = ("capture", "replay", "cli")


@contextlib.contextmanager
def _library_logs_to_stderr() -> Iterator[None]:
    handler = _StderrHandler(logging.WARNING)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def _exit(code: int) -> None:
    """Exits with `code`, at once when a remote store's client is stuck in a request the command
    gave up on (`capture.store.remote.within`): pyarrow's teardown at exit would wait for it."""
    remote = sys.modules.get("capture.store.remote")  # imported only by a command that used one
    if remote is not None:
        remote.leave_if_stuck(code)
    sys.exit(code)


class CaptureGroup(click.Group):
    """A click group whose commands are imported on first use (see `COMMANDS`).

    Example:
        >>> group = CaptureGroup(lazy_commands={"query": (".query:query_command", "Run SQL.")})
        >>> group.list_commands(click.Context(group))
        ['query']
    """

    def __init__(
        self, *args: Any, lazy_commands: dict[str, tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in self.lazy_commands:
            return command
        target, _ = self.lazy_commands[cmd_name]
        relative, _, attribute = target.partition(":")
        # ".query" is this package's module, whether it is installed as capture.cli or run as cli.
        module_name = importlib.util.resolve_name(relative, __package__)
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise click.ClickException(
                f"the {cmd_name!r} command is unavailable: importing {module_name} failed "
                f"({type(e).__name__}: {_one_line(str(e))}); check the installation"
            ) from e
        command = getattr(module, attribute, None)
        if not isinstance(command, click.Command):
            raise click.ClickException(
                f"the {cmd_name!r} command is unavailable: {target} is not a click command"
            )
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in self.lazy_commands:
                rows.append((name, self.lazy_commands[name][1]))
                continue
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Runs the command line; in standalone mode every error is one ``Error:`` line.

        click shows a usage error as three lines (usage, a hint, the error); here it is one
        line naming the help to read, with click's exit status 2.
        """
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as e:
            where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            click.echo(f"Error: {printable(e.format_message())}{where}", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            click.echo(f"Error: {printable(e.format_message())}", err=True)  # as e.show()
            _exit(e.exit_code)
        except click.Abort:
            click.echo("Error: aborted", err=True)
            sys.exit(1)
        # Outside standalone mode click returns the status of ctx.exit(N) instead of exiting.
        sys.exit(code if isinstance(code, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        with warnings.catch_warnings(), _library_logs_to_stderr():
            # Shown always and as one line, even under `-W error` or pytest's filterwarnings.
            warnings.filterwarnings("always", message="capture: ")
            warnings.showwarning = _show_warning
            try:
                return super().invoke(ctx)
            except CaptureError as e:
                raise click.ClickException(_one_line(str(e))) from e
            except click.NoSuchOption as e:
                if e.option_name != "--store":
                    raise
                raise click.UsageError(  # `capture summary --store X`
                    "--store is an option of capture itself: put it before the command, "
                    "e.g. capture --store PATH summary (or set $CAPTURE_STORE)",
                    e.ctx,
                ) from None
            except BrokenPipeError:  # `capture query ... | head`: head read what it needed
                _quiet_stdout()
                raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
            except KeyboardInterrupt:  # Ctrl-C: one line and the shell's 128 + SIGINT
                click.echo("Error: interrupted (Ctrl-C)", err=True)
                raise click.exceptions.Exit(EXIT_INTERRUPTED) from None


def _quiet_stdout() -> None:
    """Points stdout at the null device: its reader is gone (``| head`` read enough), and the
    interpreter's last flush at exit must not fail again with a traceback."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no descriptor (an embedding host): nothing
        pass  # to flush at exit either


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    """``--version``: reads the version only when asked (package metadata is slow to load)."""
    if not value or ctx.resilient_parsing:
        return
    import capture

    click.echo(f"capture {capture.__version__}")
    ctx.exit()


@click.group(
    "capture",
    cls=CaptureGroup,
    lazy_commands=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and exit.",
)
@click.option(
    "--store",
    metavar="PATH",
    envvar=STORE_ENVVAR,
    default=DEFAULT_STORE,
    show_default=False,
    help=(
        "The store: a directory, or a pyarrow filesystem URI such as s3://bucket/prefix. "
        f"Default: ${STORE_ENVVAR} if set, else {DEFAULT_STORE}."
    ),
)
@click.pass_context
def cli(ctx: click.Context, store: str) -> None:
    """Record how a PyTorch model is called, query the recordings, export the model.

    Recordings are written by capture.Recorder in Python; these commands read them.
    Data goes to stdout, messages to stderr. Exit status: 0 success, 1 an error you
    can fix (bad SQL, missing or corrupt store), 2 a usage error, 3 export completed
    but torch.export rejected the model, 130 interrupted (Ctrl-C), 141 the reader
    of stdout went away (| head). --store goes before the command.

    \b
    Example:
      capture demo
      capture summary
      capture query "SELECT model, count(*) AS calls FROM calls GROUP BY model"
      capture --store runs/prod dims --model LlamaForCausalLM -f json
    """
    ctx.obj = Settings(store=store)
