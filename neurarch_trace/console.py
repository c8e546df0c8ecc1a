"""What every ``neurarch-trace`` subcommand shares on the terminal: the program name, its one-line
messages on stderr, and an argparse parser whose usage errors are one line with exit code 1 (so that
exit 2 keeps meaning "blocked" under ``--fail-on-block``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Iterator, NoReturn

from neurarch_trace.errors import NeurarchError
from neurarch_trace.trace_options import explain_parse_error

__all__ = ["PROG", "Parser", "say", "show_warning", "stdout_to_stderr", "write_stdout"]

PROG = "neurarch-trace"


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors as one line (``neurarch-trace: ... (see PROG --help)``) and exit
    code 1."""

    def error(self, message: str) -> NoReturn:
        message = explain_parse_error(message)
        self.exit(1, f"{PROG}: {message} (see {self.prog} --help)\n")


def say(message: str) -> None:
    """Print ``neurarch-trace: <message>`` on stderr."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


def show_warning(message: Warning | str, category: type, filename: str, lineno: int, file: object = None,
                 line: object = None) -> None:
    """A warning as one line on stderr, ``neurarch-trace: warning: model.py:19: <text>`` (the
    ``warnings.showwarning`` of the command line; the path relative to the working directory)."""
    try:
        shown = os.path.relpath(filename)
    except ValueError:  # pragma: no cover - another drive on Windows
        shown = filename
    shown = filename if shown.startswith("..") else shown
    text = " ".join(str(message).split())
    print(f"{PROG}: warning: {shown}:{lineno}: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within the block, what is written to stdout goes to stderr: ``print`` (``sys.stdout``) and
    file descriptor 1 alike (``os.write(1, ...)``, ``sys.__stdout__``, a subprocess that inherits
    it), so that stdout carries only what the command itself writes (the graph, the card). Where
    descriptor 1 or 2 is closed, only ``sys.stdout`` is redirected."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
    saved = None
    try:
        saved = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # a descriptor closed (>&-): Python's streams only
        if saved is not None:
            os.close(saved)
            saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for stream in (sys.stdout, sys.__stdout__, sys.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def write_stdout(text: str, what: str, *, fix: str = "") -> None:
    """Write ``text`` (``what`` it is: ``the graph``, ``the card``) to stdout and flush it;
    ``fix`` (``"; give -o PATH to write a file"``) ends the message of a closed stdout.

    Raises:
        NeurarchError: ``cannot write <what> to stdout: <reason>``, when stdout is closed
            (``>&-``), full (``/dev/full``) or a pipe whose reader has gone.
    """
    stream = sys.stdout
    if stream is None:
        raise NeurarchError(f"cannot write {what} to stdout: stdout is closed{fix}")
    try:
        stream.write(text)
        stream.flush()
    except (OSError, ValueError) as exc:  # ValueError: I/O operation on a closed file
        reason = getattr(exc, "strerror", None) or str(exc)
        raise NeurarchError(f"cannot write {what} to stdout: {reason}") from exc
