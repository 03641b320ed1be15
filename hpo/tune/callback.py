"""``RecordCallback``: Ray Tune's trial events, written into the Optuna record.

Tune calls callbacks when a trial starts, is restored, retried or checkpointed,
for every result, when it completes, and when it finally errors; retries
(``max_failures``) keep the same Ray trial id and so continue the same Optuna
trial. Results themselves are recorded, once each and with the scheduler's
decision, by ``hpo.tune.schedulers.RecordingScheduler``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import ray.util
from ray.tune import Callback
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
from ray.util.placement_group import PlacementGroup, remove_placement_group

from hpo.errors import public_message
from hpo.record import StudyRecord

log = logging.getLogger(__name__)
PG_KEY = "train_pg_id"
# Ray Train's TuneReportCallback passes a DDP trial's checkpoint to Tune only as this
# metric (ray.tune.integration.ray_train.CHECKPOINT_PATH_KEY), never as a Tune checkpoint
TRAIN_CHECKPOINT_KEY = "checkpoint_path"


class RecordCallback(Callback):
    """Forwards trial events to a :class:`StudyRecord`.

    Args:
        record: the study's record.
        stopper_label: who stopped a trial that ends early without a recorded
            decision (e.g. a Hyperband bracket stopping a paused trial).
        on_change: called after every started and finished trial and every result
            (progress display).
    """

    def __init__(self, record: StudyRecord, stopper_label: str,
                 on_change: Callable[[], None] | None = None) -> None:
        self.record = record
        self.stopper_label = stopper_label
        self.on_change = on_change or (lambda: None)

    def __getstate__(self) -> dict:
        # Tune pickles the run config (for Tuner.restore); a live display is not state.
        return {**self.__dict__, "on_change": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.on_change = self.on_change or (lambda: None)

    def _ensure(self, trial) -> None:
        if not self.record.knows(trial.trial_id):  # trials not suggested by our searcher (PBT)
            self.record.ask(trial.trial_id, params=trial.config)

    def on_trial_start(self, iteration, trials, trial, **info):
        self._ensure(trial)
        self.record.started(trial.trial_id)
        self.on_change()

    def on_trial_restore(self, iteration, trials, trial, **info):
        self._ensure(trial)
        self.record.started(trial.trial_id)

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.record.restarted(trial.trial_id)

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        self.record.checkpointed(trial.trial_id, checkpoint.path)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self._ensure(trial)
        if result.get(TRAIN_CHECKPOINT_KEY):  # a DDP trial's checkpoint, persisted by Ray Train
            self.record.checkpointed(trial.trial_id, result[TRAIN_CHECKPOINT_KEY])
        self.on_change()

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._release_train_group(trial)
        self._note_checkpoint(trial)
        self.record.complete_or_prune(trial.trial_id, self.stopper_label)
        self.on_change()

    def on_trial_error(self, iteration, trials, trial, **info):
        self._release_train_group(trial)
        self._note_checkpoint(trial)
        text = _error_text(trial)
        log.warning("trial %s failed:\n%s", trial.trial_id, text)  # whole, in the driver's log
        self.record.fail(trial.trial_id, public_message(text))  # one line, for the study
        self.on_change()

    def on_experiment_end(self, trials, **info):
        """End FAIL the trials Tune ended ERROR without ``on_trial_error``: Tune's
        controller does that when it cannot reuse an actor for a trial
        (``TuneController._on_trial_reset``: ``reset_config`` returned False), which the
        end-of-run sweep (``end_open_trials``) would otherwise call PRUNED."""
        open_ids = set(self.record.open_trials())
        for trial in trials:
            if trial.status == "ERROR" and trial.trial_id in open_ids:
                self.record.fail(trial.trial_id, public_message(_error_text(trial)))
        self.on_change()

    def _note_checkpoint(self, trial) -> None:
        checkpoint = trial.checkpoint
        path = checkpoint.path if checkpoint is not None else (
            (trial.last_result or {}).get(TRAIN_CHECKPOINT_KEY))
        if path and self.record.knows(trial.trial_id):
            self.record.trials[trial.trial_id].last["checkpoint_location"] = path

    @staticmethod
    def _release_train_group(trial) -> None:
        """Remove a Ray Train worker group's placement group that Train did not release."""
        group_hex = (trial.last_result or {}).get(PG_KEY)
        if not group_hex:
            return
        try:
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_hex))))
        except Exception as e:  # noqa: BLE001 - already removed is the common, harmless case
            log.debug("placement group %s not removed: %s", group_hex, e)


def _error_text(trial) -> str:
    """The last error of a trial, as Tune stored it (its traceback's tail)."""
    try:
        text = trial.get_error()
    except Exception:  # noqa: BLE001 - storage may be gone; say what we know
        text = None
    if not text:
        try:
            if trial.error_file:
                with open(trial.error_file) as f:
                    text = f.read()
        except Exception:  # noqa: BLE001 - no storage or file (a trial Tune never started)
            text = None
    return str(text or "the trial failed without an error message")


# -- Tune's per-trial log files, off ------------------------------------------------------


class _WritesNothing:
    """A Tune logger callback that writes no file: the study's record is its Optuna storage
    (every result, as intermediate values and attributes), which the dashboard and the REST
    API read; Tune's ``progress.csv``, ``result.json`` and TensorBoard events of each trial
    would be a second copy, written on Tune's event loop at every result (in
    ``bench/service_overhead.py`` they cost the driver about three times what they cost
    raw Tune, as a result carries the loop's metrics), that nothing reads. Tune adds those
    three loggers unless the run has its own (``ray.tune.utils.callback``). Not Tune's
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS`` variable, as ``hpo.tune.driver`` sets Tune's
    other switches: that would reach every Tune run of the process importing the driver
    (a user's own experiments, the benchmarks' raw Tune), not only this study's."""

    _SAVED_FILE_TEMPLATES: list[str] = []

    def __init__(self) -> None:  # TBXLoggerCallback's imports tensorboardX (seconds)
        pass

    def log_trial_start(self, trial) -> None:
        pass

    def log_trial_restore(self, trial) -> None:
        pass

    def log_trial_save(self, trial) -> None:
        pass

    def log_trial_result(self, iteration, trial, result) -> None:
        pass

    def log_trial_end(self, trial, failed: bool = False) -> None:
        pass

    def update_config(self, trial, config) -> None:  # JsonLoggerCallback's params.json
        pass


class NoCSVLog(_WritesNothing, CSVLoggerCallback):
    """Stands in for Tune's ``CSVLoggerCallback``; writes nothing (see ``no_trial_logs``)."""


class NoJsonLog(_WritesNothing, JsonLoggerCallback):
    """Stands in for Tune's ``JsonLoggerCallback``; writes nothing (see ``no_trial_logs``)."""


class NoTBXLog(_WritesNothing, TBXLoggerCallback):
    """Stands in for Tune's ``TBXLoggerCallback``; writes nothing (see ``no_trial_logs``)."""


class _NoMissingTrialLogs(logging.Filter):
    """Drops the warning of Tune's ``ExperimentAnalysis`` at the end of a run that names
    only trials without ``result.json`` and ``progress.csv``, which ``no_trial_logs`` keeps
    from being written: one line per trial at the end of every study's driver log, read as
    failures. A warning naming any other failure passes."""

    MISSING = "both result.json and progress.csv were not found"

    def filter(self, record: logging.LogRecord) -> bool:
        lines = record.getMessage().splitlines()
        return not (lines[0].startswith("Failed to fetch metrics for") and len(lines) > 1
                    and all(self.MISSING in line for line in lines[1:]))


_MISSING_TRIAL_LOGS = _NoMissingTrialLogs()


def no_trial_logs() -> list[Callback]:
    """Callbacks that keep Tune from adding its per-trial log files to a run (see
    ``_WritesNothing``), and the filter of Tune's warning that they are missing."""
    logging.getLogger("ray.tune.analysis.experiment_analysis").addFilter(_MISSING_TRIAL_LOGS)
    return [NoCSVLog(), NoJsonLog(), NoTBXLog()]
