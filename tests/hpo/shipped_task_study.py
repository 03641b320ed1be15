"""Run by test_cluster.py in its own process: studies of a task that only the driver has.

``python -m tests.hpo.shipped_task_study WORKDIR SITE``: ``SITE`` holds the
example task package (``tabular-mlp``, installed there with ``pip --target``)
and is on this process's ``sys.path`` only: not installed in the virtual
environment, not on ``PYTHONPATH``, not the working directory (which Ray adds to
its workers' path). A two-node local Ray cluster: the head has 1 CPU, a second
node offers the custom resource ``special`` that every trial requires.

1. Without shipping, a task on the second node cannot import the package.
2. A study of ``tabular-mlp`` runs there through ``run_study``, which ships the
   package (``py_modules``); the same trials are then trained here, in this
   process, for the reference curves.
3. A study of ``broken-import``, a single-file module shipped alone whose
   import needs a module that only this process has: its trials fail on the
   worker and the study goes on to its budget. Its error names the helper
   module, not ``broken_task``: the connection made for study 2 was made anew
   with this task's code (``init_ray``), as a warm driver's is.

Prints a JSON report.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import optuna
import ray
import torch
from ray.cluster_utils import Cluster

import trainers
from hpo.spec import parse_spec
from hpo.tune.driver import run_study

CONFIG = {"max_updates": 12, "max_epochs": None, "eval_interval": 4, "micro_batch_size": 16,
          "width": 16, "dataset": "wine"}
BROKEN = {
    # a single-file module: shipped as it is; its import needs a module Ray does not ship
    "broken_task.py": "from driver_only_helper import BrokenTask  # noqa: F401\n",
    "driver_only_helper.py": textwrap.dedent("""
        from tabular_mlp.task import TabularMLPTask

        class BrokenTask(TabularMLPTask):
            name = "broken-import"
    """),
    "broken_task-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: broken-task\n"
                                          "Version: 0.1\n",
    "broken_task-0.1.dist-info/entry_points.txt": "[hpo.trainers]\n"
                                                  "broken-import = broken_task:BrokenTask\n",
}


@ray.remote(resources={"special": 1}, num_cpus=1)
def try_import(name: str) -> str:
    """On the node with ``special``: ``imported``, or the import's error."""
    import importlib

    try:
        importlib.import_module(name)
    except ImportError as e:
        return f"{type(e).__name__}: {e}"
    return "imported"


def spec(name: str, task: str, n_trials: int) -> dict:
    return {"name": name, "task": task, "config": CONFIG,
            "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 3e-2, "log": True},
                             "dropout": {"type": "float", "low": 0.0, "high": 0.3},
                             "activation": {"type": "categorical", "choices": ["relu", "gelu"]}},
            "objective": {"metric": "val_loss"}, "sampler": {"name": "random", "seed": 0},
            "budget": {"n_trials": n_trials, "max_concurrent_trials": 1},
            "resources": {"cpus": 1, "custom": {"special": 1}}}


def trials(name: str, url: str) -> list[dict]:
    return [{"number": t.number, "state": t.state.name, "params": t.params,
             "node_id": t.user_attrs.get("node_id"),
             "fail_reason": t.user_attrs.get("fail_reason"),
             "curve": sorted(t.intermediate_values.items())}
            for t in optuna.load_study(study_name=name, storage=url).trials]


def reference_curve(params: dict) -> list[list[float]]:
    """The trial trained here, as the trainable trains it (one thread, CPU)."""
    torch.set_num_threads(1)
    task, config = trainers.create("tabular-mlp", {**CONFIG, **params, "device": "cpu"})
    reporter = trainers.ListReporter()
    trainers.fit(task, config, reporter)
    return [[r["step"], r["val_loss"]] for r in reporter.reports]


def main(workdir: Path, site: Path) -> None:
    for path, text in BROKEN.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    sys.path.insert(0, str(site))
    report: dict = {"site_on_pythonpath": str(site) in os.environ.get("PYTHONPATH", ""),
                    "site_is_cwd": Path.cwd().resolve() == site.resolve(),
                    "tasks": trainers.list_tasks()}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    report["second_node"] = cluster.add_node(num_cpus=1, resources={"special": 1}).node_id
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    report["unshipped_import"] = ray.get(try_import.remote("tabular_mlp"))
    ray.shutdown()

    url = f"sqlite:///{workdir / 'shipped.db'}"
    for name, task, n_trials in [("shipped", "tabular-mlp", 3),
                                 ("shipped-broken", "broken-import", 2)]:
        outcome = run_study(parse_spec(spec(name, task, n_trials)), url,
                            ray_address=cluster.address, results_dir=workdir / "ray")
        report[name] = {"complete": outcome.counts.complete, "failed": outcome.counts.failed,
                        "trials": trials(name, url)}
    ray.shutdown()
    cluster.shutdown()
    report["reference"] = {t["number"]: reference_curve(t["params"])
                           for t in report["shipped"]["trials"]}
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
