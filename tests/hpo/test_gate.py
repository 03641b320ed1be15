"""The trial gate (``hpo.gate``): a driver's trials start only when the gate lets them."""

from __future__ import annotations

import threading

import optuna
import pytest
from optuna.trial import TrialState

from hpo.gate import GateKeeper, TrialResources
from hpo.tune.driver import run_study
from tests.hpo.test_driver import toy_spec


class CountingGate:
    """Lets at most ``capacity`` trials hold a slot; records what happened."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held: set[str] = set()
        self.most_held = 0
        self.granted: list[str] = []
        self.released: list[tuple[str, float]] = []
        self.refusals = 0
        self.lock = threading.Lock()

    def acquire(self, trial_id: str, resources: TrialResources) -> bool:
        with self.lock:
            assert trial_id not in self.held
            if len(self.held) >= self.capacity:
                self.refusals += 1
                return False
            self.held.add(trial_id)
            self.granted.append(trial_id)
            self.most_held = max(self.most_held, len(self.held))
            return True

    def release(self, trial_id: str, device_seconds: float) -> None:
        with self.lock:
            self.held.remove(trial_id)
            self.released.append((trial_id, device_seconds))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_keeper_asks_again_only_after_its_retry_pause_and_counts_device_seconds():
    gate, clock = CountingGate(1), Clock()
    keeper = GateKeeper(gate, TrialResources(gpus=0.0, devices=2.0), retry_s=1.0, clock=clock)
    assert keeper.acquire("a") is True
    assert keeper.acquire("b") is False and gate.refusals == 1
    clock.now += 0.5
    assert keeper.acquire("b") is False and gate.refusals == 1  # not asked within 1 s
    clock.now += 2.5
    keeper.release("a")
    assert gate.released == [("a", 6.0)]  # 3 s held x 2 devices
    assert keeper.acquire("b") is True
    key = keeper.new_key()
    assert keeper.acquire(key) is False  # refused: b holds the only slot
    clock.now += 0.5
    keeper.release("b")
    assert gate.released == [("a", 6.0), ("b", 1.0)]
    assert keeper.acquire(key) is True  # within 1 s, but asked: b's slot was just given back
    clock.now += 2.0
    keeper.release_all()
    assert gate.released == [("a", 6.0), ("b", 1.0), (key, 4.0)] and keeper.n_held == 0
    keeper.release("b")  # twice: nothing more
    assert len(gate.released) == 3


def test_keeper_without_gate_lets_everything_start():
    keeper = GateKeeper(None, TrialResources(gpus=1.0, devices=1.0))
    assert all(keeper.acquire(str(i)) for i in range(5)) and keeper.n_held == 0


def test_trial_resources_count_gpus_and_devices_of_all_workers():
    spec = toy_spec("res", resources={"cpus": 2, "gpus": 0.5, "workers": 3})
    assert TrialResources.of(spec.resources) == TrialResources(gpus=1.5, devices=1.5)
    spec = toy_spec("res", resources={"cpus": 2, "workers": 3})
    assert TrialResources.of(spec.resources) == TrialResources(gpus=0.0, devices=6.0)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("capacity", [1, 2])
def test_a_gate_of_n_slots_runs_n_trials_at_a_time_and_none_fails(capacity, sqlite_url,
                                                                  tmp_path):
    gate = CountingGate(capacity)
    spec = toy_spec(f"gated{capacity}", budget={"n_trials": 4, "max_concurrent_trials": 4},
                    resources={"cpus": 0.5})
    out = run_study(spec, sqlite_url, results_dir=tmp_path / "ray", gate=gate)
    trials = optuna.load_study(study_name=spec.name, storage=sqlite_url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    assert out.counts.complete == 4
    assert gate.most_held == capacity and gate.refusals > 0
    assert len(gate.granted) == 4 and gate.held == set()
    assert sorted(t for t, _ in gate.released) == sorted(gate.granted)
    assert all(seconds > 0 for _, seconds in gate.released)  # 0.5 CPU x time held


@pytest.mark.usefixtures("ray_session")
def test_pbt_population_respects_the_gate_and_gives_every_slot_back(sqlite_url, tmp_path):
    gate = CountingGate(1)
    spec = toy_spec("gated-pbt", budget={"n_trials": 3, "max_concurrent_trials": 3},
                    resources={"cpus": 0.5},
                    scheduler={"name": "pbt", "perturbation_interval": 6})
    run_study(spec, sqlite_url, results_dir=tmp_path / "ray", gate=gate)
    trials = optuna.load_study(study_name=spec.name, storage=sqlite_url).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
    assert gate.most_held == 1 and len(gate.granted) == 3 and gate.held == set()


@pytest.mark.usefixtures("ray_session")
def test_hyperband_under_a_one_slot_gate_finishes_every_trial(sqlite_url, tmp_path):
    """A paused trial keeps its slot; Ray's Hyperband must not wait forever for bracket
    members that the gate has not let in yet."""
    gate = CountingGate(1)
    spec = toy_spec("gated-hyperband", scheduler={"name": "hyperband", "max_t": 12,
                                                  "reduction_factor": 2},
                    budget={"n_trials": 4, "max_concurrent_trials": 4},
                    resources={"cpus": 0.5})
    out = run_study(spec, sqlite_url, results_dir=tmp_path / "ray", gate=gate)
    assert out.counts.finished == 4 and out.counts.failed == 0 and out.counts.running == 0
    assert gate.most_held == 1 and gate.held == set()
