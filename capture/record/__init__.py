"""The recording hot path: the wrapper, flattening, the structure cache, the writer thread.

Runs inside serving processes: imports torch and pyarrow only, never duckdb or the store's
readers. Modules are imported by their full name (this file imports nothing, so importing one
of them never loads its siblings).
"""
