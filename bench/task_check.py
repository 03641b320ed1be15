"""Wall time of ``hpo task check`` on a fresh ``hpo task new`` scaffold (issue 12).

Scaffolds a task into a temporary directory and runs ``hpo task check
MODULE.task:CLASS`` there as a new process, as a user would (the time includes
starting Python and importing torch). Prints the wall time and the CPU time
(user + system) of each repeat, their medians, and the load average: the
machine may be shared. Goal: under 60 s on 2 cores.

    python bench/task_check.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HPO = str(Path(sys.executable).with_name("hpo"))


def one_check(package: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one ``hpo task check`` of the scaffold in ``package``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run = subprocess.run([HPO, "task", "check", "bench_task.task:BenchTaskTask"], cwd=package,
                         capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        sys.exit(f"hpo task check failed:\n{run.stdout}{run.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "pkg"
        subprocess.run([HPO, "task", "new", "bench-task", str(package)], check=True,
                       capture_output=True)
        walls, cpus = [], []
        for i in range(args.repeats):
            wall, cpu = one_check(package)
            walls.append(wall)
            cpus.append(cpu)
            print(f"repeat {i + 1}: wall {wall:.1f} s, cpu {cpu:.1f} s, "
                  f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"median: wall {statistics.median(walls):.1f} s, cpu {statistics.median(cpus):.1f} s"
          " (goal: wall < 60 s on 2 cores)")


if __name__ == "__main__":
    main()
