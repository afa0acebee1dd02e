"""The console every command prints its tables to."""

from __future__ import annotations

import sys
from collections.abc import Callable

from rich.console import Console


def default_console() -> Console:
    probe_console = Console()
    # Piped output (CI logs, nox) would otherwise be cut to 80 columns and squeeze the table.
    return probe_console if probe_console.is_terminal else Console(width=160, file=sys.stdout)


def say_on(console: Console) -> Callable[[str], None]:
    """A command's progress line, printed as written: paths and labels may hold brackets, and a log keeps it whole."""
    def say(text: str) -> None:
        console.print(text, markup=False, soft_wrap=True, highlight=False)

    return say
