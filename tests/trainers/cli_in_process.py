"""``python -m trainers`` run in this process, for the tests of answers that come before any
training (bad options and files): the same ``trainers.cli.main``, without a new interpreter's
3 s of imports per case. The tests that train or resume still start the real command."""

from __future__ import annotations

import contextlib
import io
import subprocess

from trainers.cli import main


def run_main(*args: str) -> subprocess.CompletedProcess:
    """``main(args)`` with its streams captured; ``returncode`` is its return value or the
    exit status of the ``SystemExit`` it raised (argparse's 2; None is 0 and
    a message 1, as for the interpreter)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(list(args), code, stdout.getvalue(), stderr.getvalue())
