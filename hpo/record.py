"""The Optuna record of a study: what people, samplers and the dashboard read.

:class:`StudyRecord` is the one place that writes trials into the Optuna
storage. The Ray side (``hpo.tune``) calls it with Ray's events; it needs no
Ray itself. What it guarantees, each point answering a trap of ray's
``OptunaSearch`` (see DESIGN.md):

* every reported result is an intermediate value at ``step`` = optimizer
  updates, the last one included;
* a trial ends COMPLETE only when it trained to its end (or stopped itself,
  e.g. early stopping: its trainer's ``stop_reason`` on its last result); stopped
  from outside (a scheduler's STOP decision, the user, the time budget) before
  its planned updates it ends PRUNED, with ``stopped_by`` and ``budget_updates``
  attributes (ray#15283 lineage), and with several objectives ``last_values``
  (each objective's last reported value: Optuna keeps intermediate values of one);
* a trial that raised ends FAIL with the error text; a NaN or infinite
  objective ends FAIL with the reason, never stuck in RUNNING (optuna#3132);
* intermediate values are written in order by a thread of their own
  (``hpo.recordwriter``), off Tune's event loop; a checkpoint's location, a trial's
  end and a pruner's read wait for them first; a value that could not be stored
  ends its trial FAIL, saying so, and its checkpoint location stops before the gap;
* a COMPLETE trial's value is the objective's last reported value, or its best
  (``objective_reduce: best``);
* attributes: Ray trial id, node, checkpoint location, wall time,
  device-seconds (CPU or GPU seconds held; the study's ``device_kind`` says
  which), samples processed; start and end times are Optuna's own
  ``datetime_start`` and ``datetime_complete``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from hpo.models import ModelKeeper
from hpo.recordtypes import Counts as Counts  # re-exported
from hpo.recordtypes import Orphan as Orphan
from hpo.recordtypes import TrialListener as TrialListener
from hpo.recordtypes import TrialProgress
from hpo.recordwriter import RecordWriter
from hpo.space import distributions
from hpo.spec import StudySpec
from hpo.storage import set_trial_user_attrs, trial_id_of
from hpo.study import SPEC_ATTR as SPEC_ATTR  # re-exported: hpo.warmstart reads it here
from hpo.study import create_study as create_study  # re-exported (tests/hpo/test_record.py)
from hpo.study import open_stored_study, take_waiting
from hpo.summary import best_order
from hpo.trialvalues import final_values, last_values, set_constraints

log = logging.getLogger(__name__)

TERMINAL = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
STOP = "STOP"  # a scheduler's stop decision (ray.tune.schedulers.TrialScheduler.STOP)
STOP_REASON = "stop_reason"  # in a trial's last result: why its trainer stopped by itself
MO_RUNGS_ATTR = "mo_rungs"  # the vectors mo-asha recorded at its rungs (hpo.tune.mo_asha)
ASHA_BRACKET_ATTR = "asha_bracket"  # the bracket of an ASHA with several (hpo.tune.restore)
MEDIAN_STOPPED_ATTR = "median_stopped_at"  # the step the median rule (hard_stop: false)
                                           # stopped judging a trial at (hpo.tune.restore)


def natural(value: Any) -> int | None:
    """``value`` where it is an int >= 0 (not a bool), else None: how the restore
    attributes (``asha_bracket``, ``median_stopped_at``) are read back."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None


class StudyRecord:
    """Writes one study's trials into its Optuna storage as they really happen.

    Args:
        spec: the validated study spec.
        storage: the Optuna storage (``hpo.storage.open_storage``).
        listener: told (``trial_changed``) after every write that changes a trial's
            state or values: asked (RUNNING), adopted, requeued (the failed trial and
            its new WAITING copy), finished (COMPLETE, PRUNED, FAIL), abandoned; not
            for intermediate values (a read per result, for nothing its one user,
            the service's study summary, shows). It gets the one trial re-read from
            the storage; its exceptions are logged, never raised into the record.
        models: keeps the final models of the best COMPLETE trials as artifacts
            (``hpo.models``); default: none kept.

    A trial's ``device_seconds`` is its wall time times the devices it holds: the
    GPUs (else CPUs) of each worker times the number of workers
    (``spec.resources``).
    """

    def __init__(self, spec: StudySpec, storage: optuna.storages.BaseStorage,
                 listener: TrialListener | None = None, compare_spec: bool = True,
                 models: ModelKeeper | None = None) -> None:
        self.storage = storage
        self.listener = listener
        self.models = models
        # the spec it runs: with a stored spec's start-up trials where ``spec`` left them
        self.study, self.spec = open_stored_study(spec, storage, compare_spec)
        spec = self.spec
        self.study_id = storage.get_study_id_from_name(spec.name)
        self.distributions = distributions(spec)
        r = spec.resources
        self.devices_held = (r.gpus if r.gpus > 0 else r.cpus) * r.workers
        if "device_kind" not in self.study.user_attrs:  # what device_seconds count
            self.study.set_user_attr("device_kind", "gpu" if r.gpus > 0 else "cpu")
        self.trials: dict[str, TrialProgress] = {}
        self.best: tuple[int, float] | None = None
        self._writer: RecordWriter | None = None

    def __getstate__(self) -> dict:
        # Tune pickles its searcher, scheduler and callbacks into <results>/<study>/
        # tuner.pkl (for Tuner.restore, which the product never calls: a driver continues
        # a study from the storage), and with them this record. A live listener (a
        # database session, a display) is not state; neither is the storage, whose
        # pickle (Optuna's RDBStorage, and the study that holds it) carries the database
        # URL, password included, into a folder every node mounts and backups copy. A
        # copy records nothing: its storage and study are None.
        return {**self.__dict__, "listener": None, "_writer": None, "storage": None,
                "study": None}

    @property
    def writes(self) -> RecordWriter:
        """The writer of results (made on first use, also in an unpickled copy)."""
        if self._writer is None:
            self._writer = RecordWriter(self.storage)
        return self._writer

    def flush(self) -> None:
        """Wait for the queued result writes (a failed one ends its trial FAIL at its end)."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush the result writes and end their thread (a later write starts a new one)."""
        if self._writer is not None:
            self._writer.close()

    # -- trials come and go ------------------------------------------------------------

    def ask(self, ray_trial_id: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Start a new Optuna trial for a Ray trial; return its parameters.

        With ``params`` (PBT's own sampling, warm-start points) those values are
        used; otherwise the study's sampler suggests them.
        """
        if params is not None:
            self.study.enqueue_trial(dict(params))
        trial = self.study.ask(self.distributions)
        trial.set_user_attr("ray_trial_id", ray_trial_id)
        # its wall time counts from now, as its slot does (hpo.gate) and the study's summary
        # while it runs (from datetime_start): its worker's start holds the device too
        self.trials[ray_trial_id] = TrialProgress(trial.number, trial_id_of(trial),
                                                  started=time.monotonic())
        self._changed(trial_id_of(trial))
        return dict(trial.params)

    def orphans(self) -> list[Orphan]:
        """Trials left RUNNING in the storage by a driver that is gone.

        Call before this driver asks for any trial: one driver runs a study at a time.
        """
        self.flush()
        found = []
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id,
                                                                            t.number)
            found.append(Orphan(t.number, trial_id, dict(t.params),
                                t.user_attrs.get("checkpoint"),
                                sorted(t.intermediate_values.items())))
        return found

    def adopt(self, ray_trial_id: str, orphan: Orphan) -> None:
        """Continue an orphan's Optuna trial with a new Ray trial (resumed from its checkpoint)."""
        self.trials[ray_trial_id] = TrialProgress(orphan.number, orphan.trial_id,
                                                  started=time.monotonic(),
                                                  values=list(orphan.values),
                                                  checkpoint=orphan.checkpoint)
        self.storage.set_trial_user_attr(orphan.trial_id, "ray_trial_id", ray_trial_id)
        self._bump(orphan.trial_id, "resumed_after_driver_loss")
        self._changed(orphan.trial_id)

    def requeue(self, orphan: Orphan, reason: str) -> None:
        """End an orphan FAIL with ``reason`` and enqueue its parameters to run again.

        A requeued trial does not count against the budget (``Counts.finished``).
        """
        set_trial_user_attrs(self.storage, orphan.trial_id,
                             {"fail_reason": reason, "requeued": True})
        self.study.tell(orphan.number, state=TrialState.FAIL, skip_if_finished=True)
        self._changed(orphan.trial_id)
        self.study.enqueue_trial(orphan.params, user_attrs={"requeued_from": orphan.number})
        if self.listener is not None:  # the copy is the study's newest trial (one driver)
            newest = self.storage.get_n_trials(self.study_id) - 1
            self._changed(self.storage.get_trial_id_from_study_id_trial_number(
                self.study_id, newest))

    def abandon(self, orphan: Orphan, reason: str) -> None:
        """End an orphan FAIL with ``reason``, without running it again (PBT populations)."""
        self.storage.set_trial_user_attr(orphan.trial_id, "fail_reason", reason)
        self.study.tell(orphan.number, state=TrialState.FAIL, skip_if_finished=True)
        self._changed(orphan.trial_id)

    def end_waiting(self, stopped_by: str) -> int:
        """End PRUNED (``stopped_by``, ``budget_updates`` 0) the study's WAITING trials, the
        warm-start points and requeued parameters no driver will ask for any more once the
        study ended (``budget.stop_when`` fired, a user's stop, its budget; its timeout or a
        failure where the study is not run again: ``hpo.tune.driver.run_study``'s
        ``final``): left WAITING, an ended study kept them open for good (helper-39 found
        them after a stop, and after a stop then a ``kill -9``).
        Each is taken RUNNING first (Optuna ends only running trials), so that one another
        process took meanwhile is left to it. Returns how many were ended."""
        ended = 0
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            trial_id = take_waiting(self.storage, trial, self.distributions)
            if trial_id is None:
                continue  # taken by another process
            set_trial_user_attrs(self.storage, trial_id,
                                 {"stopped_by": stopped_by, "budget_updates": 0})
            self.study.tell(trial.number, state=TrialState.PRUNED, skip_if_finished=True)
            self._changed(trial_id)
            ended += 1
        return ended

    def exploited(self, ray_trial_id: str, donor_ray_trial_id: str, step: int | None,
                  old: dict[str, Any], new: dict[str, Any]) -> None:
        """PBT copied a donor into this trial: append the exploit to its ``exploits`` attribute.

        Each entry: ``donor_trial`` (Optuna number), ``step`` (the donor's
        optimizer updates when cloned), ``old`` and ``new`` hyperparameters;
        ``params_now`` holds the hyperparameters the trial trains with now.
        """
        t = self.trials.get(ray_trial_id)
        if t is None or t.told:
            return
        donor = self.trials.get(donor_ray_trial_id)
        entry = {"donor_trial": donor.number if donor else None, "step": step, "old": old,
                 "new": new}
        exploits = self.storage.get_trial(t.trial_id).user_attrs.get("exploits", [])
        self.storage.set_trial_user_attr(t.trial_id, "exploits", [*exploits, entry])
        self.storage.set_trial_user_attr(t.trial_id, "params_now", new)

    def checkpointed(self, ray_trial_id: str, location: str) -> None:
        """Remember a trial's newest persisted checkpoint (what a new driver resumes from)."""
        t = self.trials.get(ray_trial_id)
        if t is None or t.told or location == t.checkpoint:
            return
        # written once the values reported up to it are: never ahead of the stored curve,
        # and never one Tune already deleted (it keeps only the newest two)
        self.flush()
        if not self.writes.failed(t.trial_id):  # a gap: resume from the one before it
            self.storage.set_trial_user_attr(t.trial_id, "checkpoint", location)
            t.checkpoint = location

    def restarted(self, ray_trial_id: str) -> None:
        """Tune restarts a failed trial (``max_failures``): count it, bank its wall time."""
        t = self.trials.get(ray_trial_id)
        if t is not None and not t.told:
            self.stopped_running(ray_trial_id)
            self._bump(t.trial_id, "restarts")

    def _changed(self, trial_id: int) -> None:
        """Tell the listener, if any, of one trial as stored now; never raise."""
        if self.listener is None:
            return
        try:
            self.listener.trial_changed(self.storage.get_trial(trial_id))
        except Exception:  # noqa: BLE001 - a listener never breaks the record
            log.exception("the record's listener failed on trial id %s", trial_id)

    def _bump(self, trial_id: int, key: str) -> None:
        count = self.storage.get_trial(trial_id).user_attrs.get(key, 0)
        self.storage.set_trial_user_attr(trial_id, key, count + 1)

    def knows(self, ray_trial_id: str) -> bool:
        return ray_trial_id in self.trials

    # -- mo-asha's rungs (hpo.tune.mo_asha), kept across drivers ---------------------------

    def rung_key(self, ray_trial_id: str) -> int | str:
        """A trial's key at mo-asha's rungs: its Optuna number (kept by a trial a new driver
        resumes), or the Tune id of a trial the record does not know."""
        t = self.trials.get(ray_trial_id)
        return t.number if t is not None else ray_trial_id

    def rung_recorded(self, key: int | str, milestone: float, values: list[float],
                      went_on: bool = True) -> None:
        """Keep a vector mo-asha recorded at a rung in the trial's user attribute
        ``mo_rungs`` (``[[milestone, [value, ...]], ...]``, raw objective values; an entry
        where the rule stopped the trial ends with ``"stopped"``)."""
        if not isinstance(key, int):
            return
        trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, key)
        kept = self.storage.get_trial(trial_id).user_attrs.get(MO_RUNGS_ATTR, [])
        entry = [milestone, values] if went_on else [milestone, values, "stopped"]
        self.storage.set_trial_user_attr(trial_id, MO_RUNGS_ATTR, [*kept, entry])

    def asha_bracket(self, ray_trial_id: str, drawn: int) -> int:
        """The ASHA bracket a trial goes on in: the one its ``asha_bracket`` attribute keeps
        (a trial a new driver resumes, whose rung values are there), else ``drawn`` (Ray's
        draw), which is kept then."""
        trial_id = self.trials[ray_trial_id].trial_id
        kept = natural(self.storage.get_trial(trial_id).user_attrs.get(ASHA_BRACKET_ATTR))
        if kept is not None:
            return kept
        self.storage.set_trial_user_attr(trial_id, ASHA_BRACKET_ATTR, drawn)
        return drawn

    def median_stopped(self, ray_trial_id: str, step: int | None) -> None:
        """The median rule without ``hard_stop`` paused a trial at ``step`` for good: its
        later reports are not in the rule's means (a new driver's rule is refilled so).
        ``None``: a trial resumed from before the step it had been stopped at is judged
        again; the step kept, if any, is cleared (else a later driver would take the
        stale stop back: the review's finding)."""
        t = self.trials.get(ray_trial_id)
        if t is None or t.told:
            return
        if step is None and self.storage.get_trial(t.trial_id).user_attrs.get(
                MEDIAN_STOPPED_ATTR) is None:
            return
        self.storage.set_trial_user_attr(t.trial_id, MEDIAN_STOPPED_ATTR, step)

    def started(self, ray_trial_id: str) -> None:
        """A Ray trial (re)started running: wall time counts from now, unless it counts
        already (from its ``ask`` or ``adopt``: a trial stopped while its worker started,
        before any result, held its device too; found by the new-user walkthrough, whose
        stopped trial recorded 0.0 device-seconds)."""
        t = self.trials[ray_trial_id]
        if t.started is None:
            t.started = time.monotonic()

    def stopped_running(self, ray_trial_id: str) -> None:
        """A Ray trial stopped running (paused, failed, ended): bank its wall time."""
        t = self.trials.get(ray_trial_id)
        if t is not None and t.started is not None:
            t.wall_time_s += time.monotonic() - t.started
            t.started = None

    # -- results -----------------------------------------------------------------------

    def result(self, ray_trial_id: str, result: Mapping[str, Any]) -> None:
        """Record one reported result: an intermediate value at step = optimizer updates.

        Called once per result (``hpo.tune.schedulers.RecordingScheduler``); written
        by the record's writer thread. A value already stored at that step is not
        written again: a resumed trial reports its last evaluation once more, and one
        resumed from an older checkpoint than its last report (``checkpoint_interval_s``)
        reports the steps after that checkpoint again; its curve then goes on from there.
        """
        t = self.trials[ray_trial_id]
        if t.told:  # a late result of a trial that has ended (ray#19274)
            return
        t.last = dict(result)
        if self.spec.is_multi_objective or "step" not in result:
            return
        value = float(result[self.spec.objectives[0].metric])
        step = int(result["step"])
        before = None
        if t.values and step <= t.values[-1][0]:  # a resumed trial: this step again
            before = next((v for s, v in t.values if s == step), None)
            if t.values[-1][0] > step:  # the stored curve must not run ahead of it
                self.writes.drop_after(t.trial_id, step)
            t.values = [(s, v) for s, v in t.values if s < step]
        if before is None or before != value:  # NaN != NaN: written
            self.writes.intermediate_value(t.trial_id, step, value)
        t.values.append((step, value))

    def decided(self, ray_trial_id: str, decision: str, by: str) -> None:
        """A scheduler's decision on the trial's last result (Ray's ``CONTINUE``, ``PAUSE``,
        ``STOP``, ``NOOP``): a ``STOP`` makes ``by`` the one who stopped the trial."""
        t = self.trials.get(ray_trial_id)
        if t is None or t.told:
            return
        t.decision = decision
        if decision == STOP:
            t.stopped_by = by

    def note_stop(self, ray_trial_id: str, stopped_by: str) -> None:
        """Someone outside the trial stopped it (a scheduler, the user, the time budget)."""
        if ray_trial_id in self.trials:
            self.trials[ray_trial_id].stopped_by = stopped_by

    def frozen(self, ray_trial_id: str) -> optuna.trial.FrozenTrial:
        """The trial as stored (for Optuna pruners)."""
        self.flush()
        return self.storage.get_trial(self.trials[ray_trial_id].trial_id)

    # -- the end of a trial ------------------------------------------------------------

    def complete_or_prune(self, ray_trial_id: str, default_stopper: str,
                          stopped: bool = False) -> TrialState:
        """End a trial that stopped without error, from what the record was told.

        COMPLETE when it trained to its end: its trainer stopped by itself (its last
        result carries the trainer's ``stop_reason``: budget, early stopping) and no
        one stopped it from outside, or its last result reached its planned updates,
        or the scheduler's ``max_t`` if that is lower (ASHA and Hyperband stop every
        trial there). Otherwise PRUNED, ``stopped_by`` the scheduler that decided
        STOP (``decided``), the one noted (``note_stop``), or ``default_stopper``.
        ``stopped``: the whole experiment was stopped under it. A NaN or infinite
        objective ends it FAIL instead.
        """
        t = self.trials[ray_trial_id]
        error = self.writes.flush(t.trial_id) if not t.told else None
        if error is not None:
            return self.fail(ray_trial_id, f"its results could not all be stored: {error}")
        if t.told:
            return self.storage.get_trial(t.trial_id).state
        last = t.last
        planned = last.get("planned_updates")
        # a trial's full budget: its planned updates, or the scheduler's max_t below them
        # (ASHA and Hyperband stop every trial there; that is not a pruning)
        max_t = getattr(self.spec.scheduler, "max_t", None)
        budget = planned if max_t is None or planned is None else min(planned, max_t)
        at_end = budget is not None and last.get("step", 0) >= budget
        trainer_stop = last.get(STOP_REASON)
        by_itself = not stopped and t.stopped_by is None and trainer_stop is not None
        if not (by_itself or at_end) and (last or t.stopped_by):
            self._finish(t, TrialState.PRUNED, None, {
                "stopped_by": t.stopped_by or default_stopper,
                "budget_updates": last.get("step"), "planned_updates": planned,
                "last_values": last_values(self.spec, last)})
            return TrialState.PRUNED
        values = final_values(self.spec, t.last, t.values)
        metrics = [o.metric for o in self.spec.objectives]
        if values is None:
            missing = [m for m in metrics if m not in last]
            return self.fail(ray_trial_id, "no result reported" if not last else
                             f"its last result has no {', '.join(missing)} (an objective)")
        bad = [(m, v) for m, v in zip(metrics, values, strict=False) if not math.isfinite(v)]
        if bad:
            return self.fail(ray_trial_id, f"objective {bad[0][0]} is {bad[0][1]} "
                                           "(not finite)")
        reason = (f"stopped itself ({str(trainer_stop).replace('_', ' ')})" if not at_end else
                  "reached its planned updates" if budget == planned else
                  f"reached the scheduler's max_t ({budget} updates)")
        self._finish(t, TrialState.COMPLETE, values, {"stop_reason": reason})
        return TrialState.COMPLETE

    def fail(self, ray_trial_id: str, reason: str) -> TrialState:
        """End a trial FAIL, keeping the reason (error text) in ``fail_reason``."""
        t = self.trials[ray_trial_id]
        self.writes.flush(t.trial_id)
        if t.told:
            return self.storage.get_trial(t.trial_id).state
        self._finish(t, TrialState.FAIL, None, {"fail_reason": reason[-4000:]})
        return TrialState.FAIL

    def open_trials(self) -> list[str]:
        """Ray trial ids of this run whose Optuna trial has not ended yet."""
        return [ray_id for ray_id, t in self.trials.items() if not t.told]

    def _finish(self, t: TrialProgress, state: TrialState, values: list[float] | None,
                extra: dict[str, Any]) -> None:
        if t.started is not None:
            t.wall_time_s += time.monotonic() - t.started
            t.started = None
        checkpoint = t.last.get("checkpoint_location")
        attrs = {
            "node_ip": t.last.get("node_ip"),
            "node_id": t.last.get("node_id"),
            "checkpoint": checkpoint if checkpoint != t.checkpoint else None,  # written already
            "wall_time_s": round(t.wall_time_s, 3),
            "device_seconds": round(t.wall_time_s * self.devices_held, 3),
            "samples": t.last.get("samples"),
            **extra,
        }
        feasible = None
        if self.spec.constraints and state in (TrialState.COMPLETE, TrialState.PRUNED):
            feasible = set_constraints(self.study, self.spec, t.trial_id, t.last)
            attrs["feasible"] = feasible
        set_trial_user_attrs(self.storage, t.trial_id,
                             {k: v for k, v in attrs.items() if v is not None})
        if state == TrialState.COMPLETE and self.models is not None and \
                feasible is not False:  # before tell: Optuna takes no artifact meta on a
            # finished trial; an infeasible trial is never among the best
            self.models.trial_complete(self.storage, self.study_id, t.trial_id, t.number,
                                       values, checkpoint or t.checkpoint)
        self.study.tell(t.number, values, state=state, skip_if_finished=True)
        t.told = True
        log.info("trial %d ended %s%s", t.number, state.name,
                 f" ({extra['stopped_by']})" if extra.get("stopped_by") else "",
                 extra={"study": self.spec.name, "trial": t.number})
        self._changed(t.trial_id)
        if state == TrialState.COMPLETE and not self.spec.is_multi_objective and \
                feasible is not False:
            maximize = self.spec.objectives[0].direction == "maximize"
            if self.best is None or best_order(values[0], t.number, maximize) < \
                    best_order(self.best[1], self.best[0], maximize):
                self.best = (t.number, values[0])

    # -- the study as a whole ----------------------------------------------------------

    def counts(self) -> Counts:
        """Trials of the study by state, from the storage (states are written at once)."""
        trials = self.study.get_trials(deepcopy=False)
        states = [t.state for t in trials]
        requeued = sum(1 for t in trials if t.user_attrs.get("requeued"))
        return Counts(complete=states.count(TrialState.COMPLETE),
                      pruned=states.count(TrialState.PRUNED),
                      failed=states.count(TrialState.FAIL) - requeued,
                      running=states.count(TrialState.RUNNING), requeued=requeued)
