"""The one pid check (``trainers.process.process_alive``)."""

from __future__ import annotations

import os
import subprocess
import sys

from trainers.process import process_alive


def test_a_running_process_is_alive_and_an_exited_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert process_alive(os.getpid()) and process_alive(child.pid)
    finally:
        child.stdin.close()
        child.wait()
    assert not process_alive(child.pid)


def test_a_zombie_counts_as_gone_and_so_does_a_pid_below_one():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: a zombie
    try:
        assert not process_alive(child.pid)
    finally:
        child.wait()
    assert not process_alive(0) and not process_alive(-1)


def test_a_process_of_another_user_is_alive():
    assert process_alive(1)  # init: signalling it may be refused, it exists
