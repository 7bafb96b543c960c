"""``python -m capture.cli``: the same as the ``capture`` command."""

from .main import cli

if __name__ == "__main__":
    cli(prog_name="capture")
