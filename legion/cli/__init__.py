"""The `legion` command line: one module per group of commands (`legion.cli.app` builds the parser and
dispatches). `legion = legion.cli:main` in pyproject.toml and `python -m legion` both enter here."""

from legion.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
