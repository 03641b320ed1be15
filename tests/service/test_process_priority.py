"""Batch work below the API's CPU priority (``service.process.lower_priority``), also across
Linux's per-session scheduling groups (autogroups), where a process's own niceness alone
ranks it only within its session's group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service.process import AUTOGROUP

PROBE = ("import os; from service.process import lower_priority; lower_priority(7); "
         "print(os.getpriority(os.PRIO_PROCESS, 0)); "
         "print(open('/proc/self/autogroup').read().split()[-1])")


def _autogroup_nice() -> int:
    return int(Path(AUTOGROUP).read_text().split()[-1])


needs_autogroup = pytest.mark.skipif(not Path(AUTOGROUP).exists(),
                                     reason="this kernel has no autogroups (/proc/self/autogroup)")


def _run(new_session: bool) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         check=True, start_new_session=new_session, timeout=60,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    return int(out[0]), int(out[1])


@needs_autogroup
def test_a_session_leader_lowers_its_group():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    nice, group = _run(new_session=True)
    assert nice == min(19, base + 7)
    assert group == 7


@needs_autogroup
def test_a_process_in_its_parents_session_leaves_the_group_alone():
    before = _autogroup_nice()
    nice, group = _run(new_session=False)
    assert group == before == _autogroup_nice()
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 7)
