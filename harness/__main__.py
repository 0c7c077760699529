"""``python -m harness`` = the ``harness`` command."""

from harness.cli.app import main

main()
