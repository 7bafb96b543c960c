"""Typed errors raised by capture and replay; the CLI turns them into one-line messages."""

from __future__ import annotations

from capture.untrusted import printable_lines

__all__ = [
    "CaptureError",
    "StoreNotFound",
    "EmptyStore",
    "SchemaMismatch",
    "CorruptStoreFile",
    "UnknownModel",
    "QueryError",
    "ObservationMismatch",
    "ReplayError",
    "OutputNotWritable",
    "StateError",
]


class CaptureError(Exception):
    """Base class of every error this project raises on purpose.

    Its message often names what a store or an artifact holds (a model, an argument, a tag, a
    file name): it is shown with every control and bidirectional character escaped
    (`capture.untrusted.printable_lines`), wherever it is printed.
    """

    def __str__(self) -> str:
        return printable_lines(super().__str__())


class StoreNotFound(CaptureError):
    """No store at the given path."""


class EmptyStore(CaptureError):
    """The store exists but holds no recorded call."""


class SchemaMismatch(CaptureError):
    """A store file was written with a schema version this library cannot read."""


class CorruptStoreFile(CaptureError):
    """A capture file of the store holds values no writer writes (nulls among sizes, negative
    counts or offsets): its rows cannot be read as recorded calls, and are not silently dropped."""


class UnknownModel(CaptureError):
    """The requested model name has no recordings in the store."""


class NoSuchSymbol(CaptureError):
    """The symbol asked for is not a shared symbol of any selected call group."""


class QueryError(CaptureError):
    """A SQL query over the store failed (syntax, unknown column, ...)."""


class ObservationMismatch(CaptureError):
    """Observed calls cannot be reconciled into one set of dynamic shapes."""


class ReplayError(CaptureError):
    """Recorded metadata cannot be turned into export arguments."""


class OutputNotWritable(CaptureError):
    """A file or folder to write cannot be written there (a missing or read-only folder, a
    full filesystem); the message names the path and the fix."""


class StateError(CaptureError):
    """A state key, a declared state or a state the runner is asked for is malformed or unknown
    (`capture.state`)."""
