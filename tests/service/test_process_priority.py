"""Batch work below the API's CPU priority (``service.process.lower_priority``), also across
Linux's per-session scheduling groups (autogroups), where a process's own niceness alone
ranks it only within its session's group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.process import AUTOGROUP, session_group_niceness

PROBE = ("import os; from service.process import lower_priority, session_group_niceness; "
         "lower_priority(7); print(os.getpriority(os.PRIO_PROCESS, 0)); "
         "print(session_group_niceness())")

# /proc/self/autogroup is missing on a kernel without autogroups and reads empty for a
# process in a CPU cgroup (CI's containers), where the kernel does not group by session
needs_autogroup = pytest.mark.skipif(
    session_group_niceness() is None,
    reason=f"this process is in no autogroup ({AUTOGROUP} missing or empty)")


def _run(new_session: bool) -> tuple[int, int | None]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, start_new_session=new_session, timeout=60,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    return int(out[0]), None if out[1] == "None" else int(out[1])


@needs_autogroup
def test_a_session_leader_lowers_its_group():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    nice, group = _run(new_session=True)
    assert nice == min(19, base + 7)
    assert group == 7


@needs_autogroup
def test_a_process_in_its_parents_session_leaves_the_group_alone():
    before = session_group_niceness()
    nice, group = _run(new_session=False)
    assert group == before == session_group_niceness()
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)


def test_the_group_niceness_reads_none_where_the_file_is_empty_or_missing(tmp_path, monkeypatch):
    import service.process as process
    empty = tmp_path / "autogroup"
    empty.write_text("")
    monkeypatch.setattr(process, "AUTOGROUP", str(empty))
    assert process.session_group_niceness() is None
    empty.write_text("/autogroup-85 nice -3\n")
    assert process.session_group_niceness() == -3
    monkeypatch.setattr(process, "AUTOGROUP", str(tmp_path / "none" / "autogroup"))
    assert process.session_group_niceness() is None
    process.lower_session_group(5)       # nothing to write to: no error


def test_a_batch_child_runs_lowered_from_its_start():
    """``start_batch`` lowers the child from the parent, before the child's imports."""
    from service.process import start_batch
    probe = ("import os; from service.process import session_group_niceness; "
             "print(os.getpriority(os.PRIO_PROCESS, 0), os.getsid(0) == os.getpid(), "
             "session_group_niceness())")
    proc = start_batch([sys.executable, "-c", probe], niceness=6, stdout=subprocess.PIPE,
                       text=True, cwd=Path(__file__).resolve().parents[2])
    out, _ = proc.communicate(timeout=60)
    nice, leader, group = out.split()
    assert int(nice) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 6)
    assert leader == "True"
    # in an autogroup of its own, lowered, where it is in one (a CPU cgroup's process is not)
    assert group in (("None", "6") if session_group_niceness() is None else ("6",))
