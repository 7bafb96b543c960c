"""What ships: the artifact, its guards, the runner that routes calls, and drift checks.

Modules are imported by their full name; `replay` exports the public names (`replay.load`).
"""
