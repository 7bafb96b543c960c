"""The public `Store` (`capture.open_store`): a store's reader plus the questions asked of it.

`capture.store.reader.StoreReader` is the data-access object: files, checks, DuckDB views, SQL.
The analyses (`capture.analysis`: dims and summary; `capture.engines`: profiles and buckets)
take a reader and import it; this module sits above both and gives users one object with
``query`` and the analyses as methods (DESIGN §6), so that no module below imports the ones
above it. It imports duckdb and pyarrow, never torch: ``capture query``, ``summary`` and
``dims`` go through it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from capture.store.reader import StoreReader

if TYPE_CHECKING:
    from capture.analysis.summary import Summary

__all__ = ["Store", "open_store"]


class Store(StoreReader):
    """A capture store opened for analysis: `query()` and the analyses of its recordings.

    Use `open_store()` to get one. `query()`, `models()`, `signatures()`, `files` and
    `skipped` are the reader's (`capture.store.reader.StoreReader`); `dims()`, `summary()`,
    `profiles()` and `buckets()` ask the analysis modules, imported when first called.
    """

    def dims(self, model_name: str | None = None, **options: Any) -> pa.Table:
        """Per model, call group, tensor leaf and axis: dynamic or not, range, shared symbol.

        See `capture.analysis.groups.dims_table` for the columns and options.

        Example:
            >>> open_store("capture-store").dims().column("symbol")  # doctest: +SKIP
        """
        from capture.analysis.groups import dims_table

        return dims_table(self, model_name, **options)

    def summary(self, model_name: str | None = None) -> Summary:
        """Models, call counts, call groups, optional inputs, drift (`capture.analysis.summary`).

        Example:
            >>> open_store("capture-store").summary().calls  # doctest: +SKIP
            20
        """
        from capture.analysis.summary import summary

        return summary(self, model_name)

    def profiles(self, model_name: str | None = None, **options: Any) -> pa.Table:
        """TensorRT optimization profiles (min/opt/max per input) per call group.

        See `capture.engines.profiles.profiles_table` for the columns and options (``group``,
        ``opt``, ``max_profiles``).
        """
        from capture.engines.profiles import profiles_table

        return profiles_table(self, model_name, **options)

    def buckets(self, symbol: str | None, budget: int, **options: Any) -> pa.Table:
        """The `budget` sizes of a shared symbol that minimise padding over the recorded calls.

        See `capture.engines.buckets.buckets_table` for the columns, the symbol chosen when
        `symbol` is None, and the options (``model_name``, ``group``).
        """
        from capture.engines.buckets import buckets_table

        return buckets_table(self, symbol, budget, **options)


def open_store(path: str | os.PathLike[str], *, unsafe_sql: bool = False) -> Store:
    """Opens a capture store (a directory or a pyarrow filesystem URI) for analysis.

    By default the store's SQL reads its views and nothing else: no other file or URL is read
    or written, no DuckDB extension is installed or loaded, settings are locked.

    Args:
        path: The directory the recorder wrote to, or a URI such as ``s3://bucket/prefix``.
        unsafe_sql: Give `Store.query` DuckDB's full reach (other files, ``COPY``,
            ``ATTACH``, ``INSTALL``, ``SET``): only for SQL you trust.

    Returns:
        A `Store`; `Store.query()` runs SQL over its views.

    Raises:
        StoreNotFound: Nothing at `path`.
        EmptyStore: `path` exists but holds no recorded call.

    Example:
        >>> store = open_store("capture-store")  # doctest: +SKIP
        >>> store.query("SELECT model, count(*) FROM calls GROUP BY 1")  # doctest: +SKIP
    """
    return Store(path, unsafe_sql=unsafe_sql)
