"""The one module that uses Ray's private names (see DESIGN.md: one seam per library).

Ray gives no public way to do what these functions do; each names the gap. The
module asserts the Ray version it was written against, so that an upgrade of Ray
fails here, loudly and in one place, rather than somewhere in a running study.
Change ``RAY_VERSION`` only after checking every function below against the new
Ray's source.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable
from pathlib import Path

import ray
from ray import tune
from ray.tune.schedulers import (
    AsyncHyperBandScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    TrialScheduler,
)

from hpo.pinned import require
from hpo.workers import RAY_MAX_RESOURCE_QUANTITY

RAY_VERSION = "2.60.0"

require("Ray", ray.__version__, RAY_VERSION, __name__)
# hpo.workers' copy of the bound ``ray start --resources`` takes (it imports no Ray)
if ray._private.ray_constants.MAX_RESOURCE_QUANTITY != RAY_MAX_RESOURCE_QUANTITY:
    raise ImportError(f"hpo.workers.RAY_MAX_RESOURCE_QUANTITY is {RAY_MAX_RESOURCE_QUANTITY}, "
                      f"Ray's is {ray._private.ray_constants.MAX_RESOURCE_QUANTITY}")


def ray_connection_alive(timeout_s: float = 5.0) -> bool:
    """Whether this process's Ray connection still reaches the cluster it joined: one
    key-value read from the GCS, which raises (``WrongClusterID``) after a restart of the
    cluster, or times out when it is gone. Ray has no public liveness check of a
    connection (``ray.is_initialized`` stays true after the cluster went away).

    Args:
        timeout_s: seconds to wait for the GCS, > 0.
    """
    try:
        ray._private.worker.global_worker.gcs_client.internal_kv_get(
            b"hpo-liveness", b"hpo", timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure: start afresh rather than abort later
        return False
    return True


# -- Ray Train: the trainer of multi-worker trials -------------------------------------


def _torch_trainer_class() -> type:
    """``TorchTrainer`` without Ray Train's placement-group cleaner (see
    ``TorchTrainerWithoutCleaner`` below; built on first use: ``ray.train.torch`` imports
    torch)."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )

    class TorchTrainerWithoutCleaner(TorchTrainer):
        """Ray Train's ``TorchTrainer`` minus its ``PlacementGroupCleanerCallback``.

        Ray Train v2 starts, per run, a detached ``PlacementGroupCleaner`` actor that
        removes the run's placement group if the controller dies without stopping
        gracefully, which is what happens to every trial a scheduler stops (Tune kills the
        trial's actor, and the controller with it). The cleaner learns of the death through
        Ray's State API, which lives in Ray's dashboard; we start Ray without it
        (``include_dashboard=False``), so the call fails, and the cleaner retries every
        second forever: about 245 MB and 2 % of a core each on the head node, one more per
        stopped trial. Our own callback already removes such a run's placement group when
        Tune ends the trial (``RecordCallback._release_train_group``), so the cleaner is
        left out. Overrides the private ``_create_default_callbacks``.
        """

        __module__ = __name__
        __qualname__ = "TorchTrainerWithoutCleaner"

        def _create_default_callbacks(self):
            return [c for c in super()._create_default_callbacks()
                    if not isinstance(c, PlacementGroupCleanerCallback)]

    return TorchTrainerWithoutCleaner


def __getattr__(name: str):
    """``TorchTrainerWithoutCleaner``, built on first access (and so found by pickle)."""
    if name == "TorchTrainerWithoutCleaner":
        cls = _torch_trainer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- Ray Tune schedulers: overrides at private seams ------------------------------------

log = logging.getLogger(__name__)


def asha_rungs(scheduler: AsyncHyperBandScheduler, bracket: int = 0
               ) -> list[tuple[float, dict]]:
    """The rungs of an ASHA's ``bracket`` (Ray's order, 0 the one with the lowest first
    rung), highest first: ``(milestone, {trial id: signed value})``, the very dicts its
    decisions read and write. Ray keeps them private (``_Bracket._rungs``) and has no way
    to fill them, so a new driver's ASHA started with empty rungs
    (``hpo.tune.restore.restore_asha`` fills them from the study).

    Raises:
        IndexError: the scheduler has no such bracket.
    """
    return scheduler._brackets[_bracket_index(scheduler, bracket)]._rungs


def _bracket_index(scheduler: AsyncHyperBandScheduler, bracket: int) -> int:
    if not 0 <= bracket < len(scheduler._brackets):
        raise IndexError(f"bracket {bracket}: the scheduler has "
                         f"{len(scheduler._brackets)}")
    return bracket


def asha_brackets(scheduler: AsyncHyperBandScheduler) -> int:
    """How many brackets an ASHA has (its ``brackets`` argument)."""
    return len(scheduler._brackets)


def asha_bracket_of(scheduler: AsyncHyperBandScheduler, trial_id: str) -> int | None:
    """The bracket Ray's ``on_trial_add`` drew for a trial (``None``: not added, or
    removed); Ray keeps it private (``_trial_info``) and draws it at random."""
    bracket = scheduler._trial_info.get(trial_id)
    if bracket is None:
        return None
    return next(i for i, b in enumerate(scheduler._brackets) if b is bracket)


def asha_place(scheduler: AsyncHyperBandScheduler, trial_id: str, bracket: int) -> None:
    """Put an added trial in ``bracket`` instead of the one Ray drew (a trial a new driver
    resumes goes on in its own bracket, where its rung values are).

    Raises:
        IndexError: the scheduler has no such bracket.
    """
    scheduler._trial_info[trial_id] = scheduler._brackets[_bracket_index(scheduler, bracket)]


def median_results(scheduler: MedianStoppingRule) -> dict:
    """The results the median stopping rule ranks against: trial -> its results in order
    (``{time_attr: ..., metric: ...}`` dicts), the very dict its decisions read. Private
    in Ray (``_results``), with no way to fill it: a new driver's rule started empty
    (``hpo.tune.restore.restore_median`` fills it from the study)."""
    return scheduler._results


def median_stopped(scheduler: MedianStoppingRule) -> set:
    """The trials the median rule stopped (``hard_stop: false``: paused, then run on
    without being judged, their later results left out of its means), the very set its
    decisions read; private in Ray (``_stopped_trials``)."""
    return scheduler._stopped_trials


class HyperBand(HyperBandScheduler):
    """Ray's synchronous Hyperband, with fixes at its pause and trial-removal seams.

    * A trial that reached ``max_t`` is stopped, not paused to wait for its
      bracket-mates: it has nothing left to train, and a pause decided while its
      checkpoint is being saved is applied after the bracket is cleaned up, which
      left it PAUSED forever and Tune waiting on it (seen with ray 2.60; the
      paused-forever lineage of ray#6780 and ray#39157).
    * When a removal (a trial ended, errored or was removed) finishes the bracket,
      its PAUSED trials are stopped: Ray's ``on_trial_remove`` skips a bracket that
      the removal finished. Reads the private ``_trial_info`` to find the bracket.

    Args:
        time_attr: the result key counting progress (``step``, optimizer updates).
        max_t: the most ``time_attr`` a trial trains, >= 1.
        **kwargs: the rest of ``HyperBandScheduler``'s arguments.
    """

    def __init__(self, *, time_attr: str, max_t: int, **kwargs) -> None:
        super().__init__(time_attr=time_attr, max_t=max_t, **kwargs)
        self.time_key, self.max_t = time_attr, max_t

    def on_trial_result(self, tune_controller, trial, result):
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.PAUSE and result.get(self.time_key, 0) >= self.max_t:
            return TrialScheduler.STOP
        return decision

    def on_trial_complete(self, tune_controller, trial, result):
        self.on_trial_remove(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial):
        self.on_trial_remove(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial):
        bracket, _ = self._trial_info[trial]
        super().on_trial_remove(tune_controller, trial)
        if bracket.finished():
            bracket.cleanup_full(tune_controller)


OnExploit = Callable[[str, str, "int | None", dict, dict], None]


def _last_report(result: dict, time_key: str) -> bool:
    """Whether ``result`` is its trial's last: the trainer's ``stop_reason`` (it stops
    itself), or its ``time_key`` at or past its ``planned_updates``."""
    if result.get("stop_reason") is not None:
        return True
    step, planned = result.get(time_key), result.get("planned_updates")
    return isinstance(step, int | float) and isinstance(planned, int | float) and \
        step >= planned


def _leaves_nothing(donor: dict, receiver: dict, time_key: str) -> bool:
    """Whether the donor's ``result`` (its checkpoint's) leaves a receiver nothing to train:
    the donor's last report, or its ``time_key`` at or past the receiver's
    ``planned_updates``."""
    if _last_report(donor, time_key):
        return True
    step, planned = donor.get(time_key), receiver.get("planned_updates")
    return isinstance(step, int | float) and isinstance(planned, int | float) and \
        step >= planned


class PinnedExploits:
    """Mixin for Ray's ``PopulationBasedTraining`` and ``PB2``: pinned donor checkpoints,
    and a hook told of every exploit. Overrides PBT's private ``_checkpoint_or_exploit``
    and ``_exploit`` and reads its ``_trial_state``; Ray has no public hook for either.

    Args:
        pin_dir: where donor checkpoints are copied (``hpo.tune.driver.pins_dir``).
        on_exploit: called after each exploit as ``on_exploit(trial_id, donor_trial_id,
            donor_step, old_config, new_config)`` (Ray trial ids; ``donor_step`` the
            donor's ``time_attr`` when cloned, or ``None``; configs as copied dicts).
        time_attr: the result key of ``donor_step``.
        **kwargs: the PBT or PB2 arguments.
    """

    _trial_state: dict

    def __init__(self, pin_dir: Path, on_exploit: OnExploit | None, time_attr: str,
                 **kwargs) -> None:
        super().__init__(time_attr=time_attr, **kwargs)
        self.pin_dir, self.on_exploit, self.time_key = pin_dir, on_exploit, time_attr
        self._cloned: dict[str, str] = {}  # trial id -> path of the checkpoint it cloned last

    def _checkpoint_or_exploit(self, trial, tune_controller, upper_quantile, lower_quantile):
        """Ray's step, except how a top trial's checkpoint is kept.

        Ray schedules an extra save here; for a function trainable that reports a
        checkpoint with every result, that registers the same checkpoint twice
        and its retention then deletes checkpoints still listed ("Error handling
        checkpoint", and the restores of ray#9036). Instead the checkpoint
        reported with this very result is copied aside (pinned) and remembered.

        A trial never clones the same donor checkpoint twice in a row: while the donor
        stood still (restarting after a failure, ``max_failures``), Ray's asynchronous
        PBT sent the receiver back to that checkpoint at each of its perturbation points,
        123 times in one breaker's run, retraining the same updates and never finishing.
        It trains on instead, as when the donor has no checkpoint.

        Nor does a trial exploit at its last report (its planned updates reached, or its
        trainer stopping itself: ``stop_reason``), nor clone a donor's last report or one
        at or past its own planned updates: sent to such a checkpoint with nothing left to
        train, it reported the donor's evaluation again and ended COMPLETE with the donor's
        value under its own parameters (the breaker's finding).
        """
        state = self._trial_state[trial]
        state.last_checkpoint = self._pin(trial, state) if trial in upper_quantile else None
        if trial not in lower_quantile:
            return
        own = state.last_result or {}
        if _last_report(own, self.time_key):
            log.info("trial %s made its last report: it does not exploit", trial)
            return
        # nor clone a donor's checkpoint that leaves it nothing to train (the review's
        # finding: the same end, reached from the donor's side)
        donors = [t for t in upper_quantile if not _leaves_nothing(
            self._trial_state[t].last_result or {}, own, self.time_key)]
        if not donors:
            log.info("every top trial made its last report: trial %s trains on", trial)
            return
        trial_to_clone = random.choice(donors)
        checkpoint = self._trial_state[trial_to_clone].last_checkpoint
        if checkpoint is None:
            log.info("no checkpoint for trial %s: trial %s does not exploit it",
                     trial_to_clone, trial)
            return
        if self._cloned.get(trial.trial_id) == checkpoint.path:
            log.info("trial %s cloned trial %s's checkpoint already; it trains on",
                     trial, trial_to_clone)
            return
        self._exploit(tune_controller, trial, trial_to_clone)
        self._cloned[trial.trial_id] = checkpoint.path

    def _pin(self, trial, state) -> tune.Checkpoint | None:
        name = (state.last_result or {}).get("checkpoint_dir_name")
        if name:
            source = tune.Checkpoint(path=f"{trial.storage.trial_fs_path}/{name}",
                                     filesystem=trial.storage.storage_filesystem)
        else:  # a result without its own checkpoint: the newest one registered
            source = trial.checkpoint
        if source is None:
            return None
        target = self.pin_dir / f"{trial.trial_id}-{uuid.uuid4().hex[:8]}"
        source.to_directory(str(target))
        return tune.Checkpoint.from_directory(str(target))

    def _exploit(self, tune_controller, trial, trial_to_clone):
        old = dict(trial.config)
        step = (self._trial_state[trial_to_clone].last_result or {}).get(self.time_key)
        super()._exploit(tune_controller, trial, trial_to_clone)
        if self.on_exploit is not None:
            self.on_exploit(trial.trial_id, trial_to_clone.trial_id, step, old,
                            dict(trial.config))
