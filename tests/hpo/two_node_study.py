"""Run by test_cluster.py in its own process: a study on a two-node local Ray cluster.

The head has 1 CPU; a second node offers the custom resource ``special`` that
every trial requires. Mid-way through the second trial that node is removed and
a replacement with the same resource is added: the trial must be retried (from
its checkpoint) on the new node, and the study must finish. Prints a JSON report.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import optuna
import ray
from ray.cluster_utils import Cluster

from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.tune.driver import run_study


def main(workdir: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    first = cluster.add_node(num_cpus=1, resources={"special": 1})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    spec = parse_spec({
        "name": "two-nodes", "task": "toy-hpo",
        "config": {"max_updates": 30, "max_epochs": None, "eval_interval": 3,
                   "micro_batch_size": 8, "sleep_ms": 60},
        "search_space": {"quality": {"type": "float", "low": 0.0, "high": 1.0}},
        "objective": {"metric": "val_loss"}, "sampler": {"name": "random", "seed": 0},
        "budget": {"n_trials": 3, "max_concurrent_trials": 1},
        "resources": {"cpus": 1, "custom": {"special": 1}}, "max_failures": 3})
    url = f"sqlite:///{workdir / 'cluster.db'}"
    report: dict = {"first_node": first.node_id}

    storage = open_storage(url)  # create the schema once, before two threads use it
    result: dict = {}
    driver = threading.Thread(  # Ray adds nodes only from the main thread: the study runs aside
        target=lambda: result.update(outcome=run_study(spec, url, results_dir=workdir / "ray")),
        daemon=True)
    driver.start()
    while driver.is_alive() and "second_node" not in report:
        time.sleep(0.2)
        try:
            trials = optuna.load_study(study_name="two-nodes", storage=storage).trials
        except KeyError:
            continue
        running = [t for t in trials if t.state.name == "RUNNING"
                   and len(t.intermediate_values) >= 2]
        if len(trials) >= 2 and running:
            report["interrupted_trial"] = running[0].number
            cluster.remove_node(first)
            report["second_node"] = cluster.add_node(num_cpus=1,
                                                     resources={"special": 1}).node_id
    driver.join(timeout=300)
    outcome = result["outcome"]
    report["complete"] = outcome.counts.complete
    report["trials"] = [{"number": t.number, "state": t.state.name,
                         "node_id": t.user_attrs.get("node_id"),
                         "restarts": t.user_attrs.get("restarts", 0),
                         "steps": sorted(t.intermediate_values)}
                        for t in optuna.load_study(study_name="two-nodes", storage=url).trials]
    print("REPORT " + json.dumps(report), flush=True)
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
