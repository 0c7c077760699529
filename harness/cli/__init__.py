"""The ``harness`` command: the typer app (:mod:`.app`) and how it ends on an error (:mod:`.errors`). Imports are
lazy here, and only here, so that ``harness --help`` starts fast."""

from harness.cli.app import app, main

__all__ = ["app", "main"]
