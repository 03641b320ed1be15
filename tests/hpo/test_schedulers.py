"""Scheduler seams, driven directly with Ray's own Trial objects (no Ray session)."""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from hpo.tune.schedulers import RecordingHyperBand


class _Record:
    def __init__(self) -> None:
        self.stops: list[tuple[str, str]] = []

    def note_stop(self, trial_id: str, label: str) -> None:
        self.stops.append((trial_id, label))


class _Controller:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop_trial(self, trial: Trial) -> None:
        self.stopped.append(trial.trial_id)
        trial.set_status(Trial.TERMINATED)


def _hyperband(n_trials: int):
    scheduler = RecordingHyperBand(time_attr="step", max_t=12, reduction_factor=2,
                                   metric="val_loss", mode="min")
    scheduler.record, scheduler.label = _Record(), "hyperband"
    controller = _Controller()
    trials = [Trial("toy", stub=True, trial_id=f"t{i}") for i in range(n_trials)]
    for t in trials:
        scheduler.on_trial_add(controller, t)
        t.set_status(Trial.RUNNING)
    return scheduler, controller, trials


def test_hyperband_stops_a_trial_at_max_t_instead_of_pausing_it():
    # Ray pauses it until its bracket-mates arrive; a pause decided while its checkpoint
    # is saved outlived the bracket and Tune waited forever
    scheduler, controller, (a, b, c) = _hyperband(3)
    assert scheduler.on_trial_result(controller, a, {"step": 6, "val_loss": 1.0}) \
        == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(controller, a, {"step": 12, "val_loss": 1.0}) \
        == TrialScheduler.STOP
    assert scheduler.record.stops == [("t0", "hyperband")]  # the record says COMPLETE (max_t)
    scheduler.on_trial_complete(controller, a, {"step": 12, "val_loss": 1.0})
    assert scheduler.on_trial_result(controller, b, {"step": 12, "val_loss": 0.5}) \
        == TrialScheduler.STOP


def test_hyperband_trial_that_ends_by_itself_is_not_noted_as_stopped():
    scheduler, controller, (a, b) = _hyperband(2)
    scheduler.on_trial_result(controller, a, {"step": 9, "val_loss": 1.0})
    scheduler.on_trial_complete(controller, a, {"step": 9, "val_loss": 1.0})  # returned
    assert scheduler.record.stops == []
    b.set_status(Trial.PAUSED)
    scheduler.on_trial_remove(controller, b)  # Tune removing a paused trial: a stop
    assert scheduler.record.stops == [("t1", "hyperband")]
