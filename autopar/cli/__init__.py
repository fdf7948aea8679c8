"""The ``autopar`` command line: ``main`` builds the parser from one module per command group."""

from autopar.cli.main import main

__all__ = ["main"]
