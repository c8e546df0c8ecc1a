"""What every ``neurarch-trace`` subcommand shares on the terminal: the program name, its one-line
messages on stderr, and an argparse parser whose usage errors are one line with exit code 1 (so that
exit 2 keeps meaning "blocked" under ``--fail-on-block``)."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

__all__ = ["PROG", "Parser", "say"]

PROG = "neurarch-trace"


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (``neurarch-trace: ... (see PROG --help)``) and exit
    code 1."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{PROG}: {message} (see {self.prog} --help)\n")


def say(message: str) -> None:
    """Print ``neurarch-trace: <message>`` on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
