"""Whether a process still runs: the one pid check of the project (``hpo.lease``, the
service's dispatcher, its stale metrics folders and the checkpoint writer's leftovers all
ask it)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine and has not exited.

    A zombie (exited, not yet reaped by its parent) counts as gone. A process of
    another user (``PermissionError``) counts as alive: it exists. A pid below 1
    names no single process and counts as gone.
    """
    if pid < 1:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """``Z`` in ``/proc/PID/stat`` (Linux); ``False`` where there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
