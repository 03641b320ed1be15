"""Fair share and quotas with three owners, one greedy (issue 15.3): each owner's share of
the trial slots over time, and the most the greedy owner ever held against its quota.

What runs for real: the service's database tables, its ``Dispatcher`` (claims, fair share,
waiting studies, reaping) and each driver's ``QuotaGate`` (``service.quotas``: slots taken
under the owner's locked quota row and given back with their device-seconds). What is
simulated: the trials. A driver here is a thread that, like ``run_study`` with
``max_concurrent_trials``, keeps up to that many trials of its study going, each taking a
slot through the gate and a place on a "cluster" of ``--cluster-slots`` trial places, then
sleeping ``--trial-s`` seconds (+-50 %). Real Ray trials would only make each step slower
on the 2 shared cores; the order and the shares come from the service's code either way.

Owners: ``greedy`` queues ``--greedy-studies`` studies at once, each wanting 4 trials at a
time (12 trials each), under a quota of ``--greedy-quota`` running trials; ``steady`` and
``late`` (no quota) queue 3 studies of 8 trials, 2 at a time, ``late`` after
``--late-after-s`` seconds. ``--drivers`` studies run at once (``HPO_MAX_RUNNING_STUDIES``).

    python bench/fair_share.py [--seconds 40] [--database-url URL]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from pathlib import Path

import sqlalchemy as sa

from hpo.gate import TrialResources
from service.app import create_app
from service.auth import create_token
from service.db import QuotaRow, Status, StudyRow, TokenRow, TrialSlotRow
from service.dispatcher import Dispatcher
from service.quotas import QuotaGate
from service.settings import Settings
from service.worker import finish

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

CPU = TrialResources(gpus=0.0, devices=1.0)


class Cluster:
    """Trial places on the simulated cluster."""

    def __init__(self, n: int) -> None:
        self.free = threading.Semaphore(n)


class ThreadDriver(threading.Thread):
    """A study's driver (simulated trials, real gate); looks like a ``DriverProcess``."""

    def __init__(self, bench: Bench, name: str, claim: str, log_path: Path) -> None:
        super().__init__(daemon=True)
        self.bench, self.name, self.claim, self.log_path = bench, name, claim, log_path
        self.pid = 0
        self.code: int | None = None

    def run(self) -> None:
        b = self.bench
        with b.sessions() as s:
            row = s.execute(sa.select(StudyRow).where(StudyRow.name == self.name)).scalar_one()
        gate = QuotaGate(b.sessions, row.id, self.claim)
        n_trials, concurrent = row.n_trials, row.spec["budget"]["max_concurrent_trials"]
        started, running = 0, []
        while started < n_trials or running:
            running = [t for t in running if t.is_alive()]
            if started < n_trials and len(running) < concurrent and \
                    gate.acquire(f"t{started}", CPU):
                t = threading.Thread(target=self.trial, args=(gate, f"t{started}"))
                t.start()
                running.append(t)
                started += 1
                continue
            time.sleep(0.05)
        gate.clear_waiting()
        finish(b.sessions, self.name, self.claim, Status.COMPLETED)
        self.code = 0

    def trial(self, gate: QuotaGate, key: str) -> None:
        with self.bench.cluster.free:
            seconds = self.bench.trial_s * random.uniform(0.5, 1.5)
            time.sleep(seconds)
        gate.release(key, seconds)

    def exit_code(self) -> int | None:
        return self.code

    def exit_reason(self) -> str:
        return "exited"

    def log_tail(self) -> str:
        return ""

    def close(self) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def wait(self, timeout_s: float) -> None:
        self.join(max(0.0, timeout_s))


class BenchDispatcher(Dispatcher):
    bench: Bench

    def _spawn(self, name: str, claim: str) -> None:
        driver = self.drivers[name] = ThreadDriver(self.bench, name, claim, Path("none"))
        self.bench.starts.append((time.monotonic() - self.bench.t0, name))
        driver.start()


class Bench:
    def __init__(self, args) -> None:
        self.args, self.trial_s = args, args.trial_s
        url = args.database_url or f"sqlite:///{tempfile.mkdtemp(prefix='fair-')}/hpo.db"
        self.settings = Settings(database_url=url, run_dispatcher=False, warm_drivers=False,
                                 max_running_studies=args.drivers, dispatch_interval_s=0.2,
                                 results_dir=Path(tempfile.mkdtemp(prefix="fair-results-")))
        self.app = create_app(self.settings)
        self.sessions = self.app.state.components.sessions
        self.cluster = Cluster(args.cluster_slots)
        self.starts: list[tuple[float, str]] = []
        self.t0 = time.monotonic()

    def spec(self, name: str, n_trials: int, concurrent: int) -> dict:
        return {"name": name, "task": "digits", "objective": {"metric": "val_accuracy"},
                "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1}},
                "budget": {"n_trials": n_trials, "max_concurrent_trials": concurrent}}

    def run(self) -> None:
        a = self.args
        tokens = {n: create_token(self.sessions, n) for n in ("greedy", "steady", "late")}
        with self.sessions.begin() as s:
            greedy = s.execute(sa.select(TokenRow.id).where(TokenRow.name == "greedy")).scalar()
            s.add(QuotaRow(owner_id=greedy, max_running_trials=a.greedy_quota))
        names = dict(self._owner_names())
        with TestClient(self.app) as client:
            def submit(owner: str, name: str, n: int, c: int) -> None:
                r = client.post("/v1/studies", json=self.spec(name, n, c),
                                headers={"Authorization": f"Bearer {tokens[owner]}"})
                assert r.status_code == 201, r.text

            for i in range(a.greedy_studies):
                submit("greedy", f"greedy-{i}", 12, 4)
            for i in range(3):
                submit("steady", f"steady-{i}", 8, 2)
            d = BenchDispatcher(self.settings, self.sessions, self.app.state.components.studies)
            d.bench = self
            self.t0 = time.monotonic()
            timeline, late_sent = [], False
            while time.monotonic() - self.t0 < a.seconds:
                now = time.monotonic() - self.t0
                if not late_sent and now >= a.late_after_s:
                    for i in range(3):
                        submit("late", f"late-{i}", 8, 2)
                    late_sent = True
                d.run_once()
                timeline.append((now, self._slots(names)))
                if late_sent and not d.drivers and not self._queued():
                    break  # all done
                time.sleep(0.1)
            report(timeline, self.starts, a)

    def _queued(self) -> int:
        with self.sessions() as s:
            return s.execute(sa.select(sa.func.count()).select_from(StudyRow).where(
                StudyRow.status.in_([Status.QUEUED, Status.RUNNING]))).scalar_one()

    def _owner_names(self):
        with self.sessions() as s:
            return s.execute(sa.select(TokenRow.id, TokenRow.name)).all()

    def _slots(self, names: dict) -> dict[str, int]:
        with self.sessions() as s:
            rows = s.execute(sa.select(TrialSlotRow.owner_id, sa.func.count())
                             .group_by(TrialSlotRow.owner_id)).all()
        return {names[o]: n for o, n in rows}


def report(timeline, starts, a) -> None:
    owners = ("greedy", "steady", "late")
    print(f"{'window s':>10} " + " ".join(f"{o:>8}" for o in owners) + "   (share of held slots)")
    window = a.window_s
    buckets: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for t, slots in timeline:
        for o in owners:
            buckets[int(t // window)][o].append(slots.get(o, 0))
    total_share = defaultdict(float)
    for b in sorted(buckets):
        means = {o: sum(v) / len(v) for o, v in buckets[b].items()}
        held = sum(means.values()) or 1.0
        print(f"{b * window:>4.0f}-{(b + 1) * window:<5.0f} " +
              " ".join(f"{means[o] / held:>8.2f}" for o in owners))
        for o in owners:
            total_share[o] += means[o]
    all_held = sum(total_share.values()) or 1.0
    print("whole run  " + " ".join(f"{total_share[o] / all_held:>8.2f}" for o in owners))
    most = max((slots.get("greedy", 0) for _, slots in timeline), default=0)
    print(f"greedy held at most {most} slots; its quota is {a.greedy_quota} running trials: "
          f"{'never over' if most <= a.greedy_quota else 'OVER'}")
    first = {o: next((t for t, n in starts if n.startswith(o)), None) for o in owners}
    print("first study started at (s): " + ", ".join(
        f"{o} {t:.1f}" if t is not None else f"{o} never" for o, t in first.items()) +
        f" (late queued at {a.late_after_s:g} s)")
    print(f"all done after {timeline[-1][0]:.1f} s" if timeline else "nothing ran")
    print("start order: " + " ".join(n for _, n in starts))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=40.0)
    p.add_argument("--database-url", default=None)
    p.add_argument("--drivers", type=int, default=4, help="HPO_MAX_RUNNING_STUDIES")
    p.add_argument("--cluster-slots", type=int, default=8)
    p.add_argument("--greedy-studies", type=int, default=8)
    p.add_argument("--greedy-quota", type=int, default=4)
    p.add_argument("--trial-s", type=float, default=1.0)
    p.add_argument("--late-after-s", type=float, default=8.0)
    p.add_argument("--window-s", type=float, default=5.0)
    args = p.parse_args()
    random.seed(0)
    Bench(args).run()


if __name__ == "__main__":
    main()
