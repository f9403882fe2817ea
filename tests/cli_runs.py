"""The `beton` command run in this process: ``main`` with the arguments a user types, its output captured.

Tests of what a command prints and returns use this rather than a subprocess, which would start an interpreter and
import torch and numba again for each command (seconds each). What only a separate process shows stays in a
subprocess: ``python -m beton`` and the one-line error message (tests/tools/test_cli.py), a kill mid-write, and
anything about the process's environment or its import path.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess

from beton.tools.cli import main


def run_cli(*arguments, cwd=None) -> subprocess.CompletedProcess:
    """``beton ARGUMENTS`` (run in ``cwd`` if given): its exit status, standard output and standard error, as
    ``subprocess.run(..., capture_output=True, text=True)`` returns them."""
    arguments = [str(argument) for argument in arguments]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), _working_directory(cwd):
        try:
            status = main(arguments)
        except SystemExit as exit:  # argparse's usage errors (2) and --help / --version (0)
            status = exit.code
    if status is None:
        status = 0
    elif not isinstance(status, int):  # sys.exit("message"): printed, status 1, as the interpreter does
        print(status, file=stderr)
        status = 1
    return subprocess.CompletedProcess(["beton", *arguments], status, stdout.getvalue(), stderr.getvalue())


@contextlib.contextmanager
def _working_directory(path):
    if path is None:
        yield
        return
    previous = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(previous)
