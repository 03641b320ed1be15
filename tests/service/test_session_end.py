"""The local Ray head's last step ends what is left of its session (``service.process.
end_session``): the breaker saw Ray's agents alive minutes after a SIGKILL of ``hpo serve``,
whose README says its children die with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from service.process import session_members

LEADER = r"""
import json, subprocess, sys
from service.process import end_session, session_members
WAIT = "print(1, flush=True); time.sleep(60)"
stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); " + WAIT], stdout=subprocess.PIPE)
obedient = subprocess.Popen([sys.executable, "-c", "import time; " + WAIT],
    stdout=subprocess.PIPE)
stubborn.stdout.readline(); obedient.stdout.readline()  # both ignore or take SIGTERM now
before = sorted(session_members())
killed = end_session(grace_s=1.0)
stubborn.wait(); obedient.wait()
print(json.dumps({"before": before, "killed": killed, "stubborn": stubborn.pid,
                  "obedient": obedient.pid, "codes": [stubborn.returncode, obedient.returncode],
                  "after": session_members()}))
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_a_session_leader_ends_every_other_process_of_its_session():
    out = subprocess.run([sys.executable, "-c", LEADER], capture_output=True, text=True,
                         timeout=60, start_new_session=True, check=True)
    got = json.loads(out.stdout)
    assert got["before"] == sorted([got["stubborn"], got["obedient"]])
    assert got["killed"] == [got["stubborn"]]  # SIGTERM ignored: SIGKILL after the grace
    assert got["codes"] == [-signal.SIGKILL, -signal.SIGTERM] and got["after"] == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
@pytest.mark.skipif(sys.platform.startswith("linux") and os.getsid(0) == os.getpid(),
                    reason="pytest leads a session of its own here (setsid, a container's "
                           "first process): the case needs a process that does not")
def test_outside_a_session_of_its_own_nothing_is_ended():
    """Run by hand from a shell, the head must not end the shell's session."""
    from service.process import end_session

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert end_session(grace_s=0.1) == [] and _alive(sleeper.pid)
        assert sleeper.pid in session_members()
    finally:
        sleeper.kill()
        sleeper.wait()


SHIM = r"""
from service.server import LocalRay
ray = LocalRay(1)
print(ray.proc.pid, flush=True)
import time
time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")
def test_sigkill_of_the_service_leaves_no_process_of_its_local_ray():
    """The whole local cluster goes with ``hpo serve``: SIGKILL the process that started
    the Ray head (as ``hpo serve`` does), and every process of the head's session ends."""
    shim = subprocess.Popen([sys.executable, "-c", SHIM], stdout=subprocess.PIPE, text=True)
    try:
        head = int(shim.stdout.readline())
        assert head and _alive(head)
    finally:
        shim.kill()
        shim.wait()

    def in_session() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[0] != "Z" and int(fields[3]) == head:
                    found.append(int(entry))
        return found

    deadline = time.monotonic() + 90
    while (left := in_session()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []
