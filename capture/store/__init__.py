"""The table format: files, checked reads, claims, rollups, compaction, the reader.

docs/schema.md is its specification. Modules are imported by their full name (this file imports
nothing: the writer uses the file helpers without loading duckdb).
"""
