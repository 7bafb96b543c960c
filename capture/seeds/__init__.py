"""The seed-compatible API (InputObserver, string_type, ...) on capture's one engine.

Modules are imported by their full name; `capture` exports the public names.
"""
