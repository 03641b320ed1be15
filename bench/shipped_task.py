"""Start-up delay of a trial whose task's code Ray ships, against a built-in task's.

One local Ray cluster (``ray.cluster_utils.Cluster``: a head and a worker node)
runs small studies one after another, each as its own Ray job (a new driver
connection, as the service's drivers are): the built-in ``digits``, and the
example task ``tabular-mlp`` (``examples/tasks/tabular_mlp``), installed with
``pip --target`` into a directory that only this process has on its path, so
its package reaches the trials through Ray's runtime environment
(``py_modules``). The first shipped study uploads and unpacks the package; the
later ones find it in the node's cache.

A trial's start-up delay: from the trial's creation (Optuna's ``datetime_start``,
when the searcher hands it to Tune) to its first reported result, one optimizer
update and one evaluation later. The first trial of each study starts a new
worker process; the second reuses it (``reuse_actors``).

Goal (issue 12): a shipped-code trial starts within 5 s of a built-in one,
after the first shipped study.

    python bench/shipped_task.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import ray
from ray.cluster_utils import Cluster

from hpo.spec import parse_spec
from hpo.tune.driver import run_study

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tasks" / "tabular_mlp"
TASKS = {"digits": {"width": 8, "depth": 1}, "tabular-mlp": {"width": 16, "depth": 1}}


def install_example(workdir: Path) -> Path:
    """``pip install --target`` of a copy of the example package; the target, put on
    this process's path only."""
    source, site = workdir / "example-src", workdir / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site), str(source)],
                   check=True)
    sys.path.insert(0, str(site))
    return site


def start_up_delays(task: str, name: str, url: str, address: str, workdir: Path
                    ) -> list[float]:
    """Run a 2-trial study of ``task`` as a new Ray job; each trial's start-up delay (s)."""
    first_report: dict[int, datetime.datetime] = {}

    def seen(_record) -> None:
        now = datetime.datetime.now()  # Optuna's datetime_start is local time too
        for t in optuna.load_study(study_name=name, storage=url).trials:
            if t.intermediate_values and t.number not in first_report:
                first_report[t.number] = now

    spec = parse_spec({
        "name": name, "task": task,
        "config": {"max_updates": 1, "max_epochs": None, **TASKS[task]},
        "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        "objective": {"metric": "val_loss"}, "sampler": {"name": "random", "seed": 0},
        "budget": {"n_trials": 2, "max_concurrent_trials": 1}})
    ray.shutdown()  # a new job, as a new driver process of the service would be
    run_study(spec, url, ray_address=address, results_dir=workdir / "runs", on_change=seen)
    trials = optuna.load_study(study_name=name, storage=url).trials
    return [(first_report[t.number] - t.datetime_start).total_seconds() for t in trials]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of (built-in study, shipped study) after the first")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-shipped-"))
    install_example(workdir)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    url = f"sqlite:///{workdir / 'bench.db'}"
    plan = [("digits", "built-in"), ("tabular-mlp", "shipped, first")]
    plan += [("digits", "built-in"), ("tabular-mlp", "shipped, cached")] * args.rounds
    rows = []
    try:
        for i, (task, kind) in enumerate(plan):
            delays = start_up_delays(task, f"bench-{i}", url, cluster.address, workdir)
            rows.append((kind, delays))
            print(f"{kind:16s} {task:12s} trial 0 (new worker) {delays[0]:6.2f} s   "
                  f"trial 1 (reused) {delays[1]:6.2f} s", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)
    builtin = statistics.median(d[0] for kind, d in rows if kind == "built-in")
    cached = statistics.median(d[0] for kind, d in rows if kind == "shipped, cached")
    print(f"median new-worker start: built-in {builtin:.2f} s, shipped (cached) {cached:.2f} s: "
          f"{cached - builtin:+.2f} s (goal <= +5 s)")


if __name__ == "__main__":
    main()
