"""``run_study``: run a study to its budget on Ray Tune, recording it in the Optuna storage.

The Tuner is assembled from small ``build_*`` pieces: the record (Optuna side),
the searcher that asks the study, the scheduler, the trainable with its
resources, and the callback that writes every other event into the record (the
scheduler, wrapped in ``RecordingScheduler``, records the results).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import sqlalchemy.exc
from ray import tune

import trainers
from hpo.board import StudyBoard, note_failure
from hpo.errors import SpecError, public_message
from hpo.gate import GateKeeper, TrialGate, TrialResources
from hpo.lease import DriverLease
from hpo.models import ModelKeeper, artifact_store, study_dir_clash
from hpo.notes import NoteEnd
from hpo.record import Counts, Orphan, StudyRecord, TrialListener
from hpo.spec import POPULATION_SCHEDULERS, StudySpec
from hpo.stopping import StudyStopRule
from hpo.storage import open_storage
from hpo.summary import best_single, feasible
from hpo.taskcode import task_code
from hpo.tune.callback import RecordCallback, no_trial_logs
from hpo.tune.cluster import check_resources, init_ray
from hpo.tune.pbt import build_pbt, remove_pins
from hpo.tune.pbt import param_space as pbt_param_space
from hpo.tune.schedulers import RecordingScheduler, build_scheduler
from hpo.tune.searcher import GatedVariants, StudySearcher
from hpo.tune.trainable import (
    ScratchCleanup,
    TrialSetup,
    checkpoint_policy,
    fsdp_scratch,
    train_trial,
)
from hpo.validation import check_budgets
from hpo.warmstart import enqueue_warm_start, warm_start_points

DEFAULT_RESULTS_DIR = "hpo-runs"

# Ray Tune's console reporter would interleave with ours (its legacy one at verbose=0
# prints nothing); its warning about frequent experiment snapshots is noise here; its
# SIGINT handler would end trials as if finished (``should_interrupt`` decides).
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")


@dataclasses.dataclass(frozen=True)
class StudyOutcome:
    """What a finished ``run_study`` returns."""

    name: str
    counts: Counts
    stopped: bool
    interrupted: bool
    best_number: int | None
    best_value: float | None
    best_params: dict | None
    # multi-objective: the Pareto-optimal COMPLETE trials as (number, values, params)
    pareto_front: list[tuple[int, list[float], dict]] = dataclasses.field(default_factory=list)
    # the budget.stop_when rule that ended the study before its budget (hpo.stopping)
    stop_reason: str | None = None
    # the first FAIL trial's fail_reason, where every finished trial failed
    all_failed_reason: str | None = None


def build_trainable(spec: StudySpec, results_dir: Path):
    """The trainable with its shared setup and its resource request. Its trials load the
    task class from its ``module:Class`` target, not from the worker's entry points."""
    r = spec.resources
    code = task_code(spec.task)
    setup = TrialSetup(task=spec.task, config={**spec.config, "parallelism": r.parallelism},
                       cpus=r.cpus, gpus=r.gpus,
                       workers=r.workers, results_dir=str(results_dir.resolve()),
                       custom=dict(r.custom), target=code.target,
                       **checkpoint_policy(spec))
    trainable = tune.with_parameters(train_trial, setup=setup)
    if r.workers > 1:  # the Train workers get their own placement group; the trial itself
        return tune.with_resources(trainable, {"cpu": 0.01})  # must not hold their CPUs
    return tune.with_resources(trainable, {"cpu": r.cpus, "gpu": r.gpus, **r.custom})


class StopWhen(tune.Stopper):
    """Stops the whole experiment when a user asks (``should_stop``) or the driver is
    interrupted (``should_interrupt``). Tune checks it on every step of its loop, so
    running trials end within seconds.
    """

    def __init__(self, should_stop: Callable[[], bool],
                 should_interrupt: Callable[[], bool]) -> None:
        self.should_stop, self.should_interrupt = should_stop, should_interrupt
        self.stopped = self.interrupted = False

    def __call__(self, trial_id: str, result: dict) -> bool:
        return False

    def __getstate__(self) -> dict:  # Tune pickles the run config; callables are not state
        return {"stopped": self.stopped, "interrupted": self.interrupted}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.should_stop = self.should_interrupt = lambda: False

    def stop_all(self) -> bool:
        self.interrupted = self.interrupted or bool(self.should_interrupt())
        self.stopped = self.stopped or (not self.interrupted and bool(self.should_stop()))
        return self.stopped or self.interrupted


def build_tuner(spec: StudySpec, record: StudyRecord, plan: Plan, results_dir: Path,
                on_change: Callable[[], None] | None, stopper: StopWhen,
                keeper: GateKeeper | None = None,
                stop_rule: StudyStopRule | None = None) -> tune.Tuner:
    """A Tuner for the planned trials of ``spec``: orphans to resume, then new ones; each
    trial made only when ``keeper`` (the run's trial gate, ``hpo.gate``) lets it start,
    and none once ``stop_rule`` (the spec's ``budget.stop_when``) fired."""
    keeper = keeper or GateKeeper(None, TrialResources.of(spec.resources))
    objective = spec.objectives[0]
    param_space = None
    max_concurrent = spec.budget.max_concurrent_trials
    if spec.scheduler.name in POPULATION_SCHEDULERS:  # Ray's PBT refuses any search algorithm
        scheduler = RecordingScheduler(build_pbt(spec, record, pins_dir(spec, results_dir)),
                                       record, spec.scheduler.name)
        search_alg = GatedVariants(keeper, max_concurrent=max_concurrent,
                                   random_state=spec.sampler.seed)
        param_space = pbt_param_space(spec)
        max_concurrent = None  # Tune would ignore it for a variant generator, with a warning
    else:
        task, config = trainers.create(spec.task, spec.config)
        scheduler = build_scheduler(spec, record, trainers.planned_updates(task, config))
        search_alg = StudySearcher(record, plan.n_new, plan.resumes, keeper, stop_rule)
    tune_config = tune.TuneConfig(
        metric=objective.metric, mode="max" if objective.direction == "maximize" else "min",
        search_alg=search_alg, scheduler=scheduler,
        num_samples=plan.n_ray_trials, max_concurrent_trials=max_concurrent,
        # a multi-worker trial's thread runs a Ray Train run, which takes longer to wind
        # down after a stop than Tune waits for before reusing its actor
        # (TUNE_FUNCTION_THREAD_TIMEOUT_S, 2 s): the next trial would end ERROR unstarted
        reuse_actors=spec.resources.workers == 1, time_budget_s=spec.budget.timeout_s)
    run_config = tune.RunConfig(
        name=spec.name, storage_path=str(results_dir.resolve()), verbose=0, stop=stopper,
        callbacks=[RecordCallback(record, spec.scheduler.name, on_change), *no_trial_logs(),
                   *([ScratchCleanup(fsdp_scratch(results_dir.resolve()))]
                     if spec.resources.parallelism == "fsdp" else [])],
        failure_config=tune.FailureConfig(max_failures=spec.max_failures),
        checkpoint_config=tune.CheckpointConfig(num_to_keep=2))
    return tune.Tuner(build_trainable(spec, results_dir), tune_config=tune_config,
                      run_config=run_config, param_space=param_space)


def pins_dir(spec: StudySpec, results_dir: Path) -> Path:
    """Where PBT keeps the donor checkpoints it hands to exploiting trials."""
    return results_dir.resolve() / spec.name / "pbt-pinned-checkpoints"


def run_study(spec: StudySpec, storage_url: str, *, ray_address: str | None = None,
              results_dir: str | Path = DEFAULT_RESULTS_DIR, num_cpus: int | None = None,
              on_change: Callable[[StudyRecord], None] | None = None,
              should_stop: Callable[[], bool] | None = None,
              should_interrupt: Callable[[], bool] | None = None,
              listener: TrialListener | None = None,
              compare_spec: bool = True, gate: TrialGate | None = None,
              owner: str | None = None,
              artifact_dir: str | Path | None = None, final: bool = False) -> StudyOutcome:
    """Run ``spec`` until ``budget.n_trials`` trials of the study have finished.

    The dataset check (scheduler budgets against the trials' planned updates)
    runs at every start, before anything is stored, and raises ``SpecError``
    naming the field (the service then ends the study FAILED with that one
    line). The other runtime checks (the cluster can hold a trial, warm-start
    sources) happen before a new study is stored. One driver runs a study at a
    time (``hpo.lease``).

    Args:
        spec: a validated spec (``hpo.spec.load_spec``).
        storage_url: the Optuna storage (SQLite file or PostgreSQL URL).
        ray_address: a Ray cluster to join; default ``RAY_ADDRESS`` or a local Ray.
        results_dir: where Ray keeps trial results and checkpoints; on a
            cluster, a path every node can reach.
        num_cpus: CPUs of a local Ray (default: all).
        on_change: called with the record whenever a trial reports or ends.
        should_stop: polled while the study runs, and once before its first trial
            starts; when it returns true, every running trial is stopped and recorded
            as stopped by the user (PRUNED, ``stopped_by: user``, unless it had trained
            to its end). A stop seen before the first trial starts none (Tune is not
            started), unless trials an earlier driver left RUNNING are to be resumed:
            those are resumed and stopped likewise.
        should_interrupt: polled likewise; when it returns true the driver stops
            and leaves its running trials RUNNING with their checkpoints, to be
            resumed by the next driver of the study (Ctrl-C, a service shutdown).
        listener: told of every trial the record changes (``StudyRecord``).
        compare_spec: False when ``spec`` is the study's own stored spec (the
            service's driver): it is then not compared with the Optuna copy.
        gate: asked before each trial starts and told when it ends (``hpo.gate``); while
            it refuses, trials wait (none fails). Every slot it gave is given back by
            the time ``run_study`` returns or raises. Default: none.
        artifact_dir: where the final models of the best trials are kept (an Optuna
            ``FileSystemArtifactStore``, ``hpo.models``); default
            ``<results_dir>/artifacts``.
        owner: the study's owner, for its dashboard note (``hpo.board``); default none.
        final: whether this run's end ends the study for good (the service's: a
            COMPLETED, STOPPED or FAILED study is not run again). The study's WAITING
            trials (queued points, requeued trials) end PRUNED when it ends but for an
            interruption; after ``budget.timeout_s`` or a failure only where ``final``:
            ``hpo run`` run again continues the study, and asks them then.

    Raises:
        SpecError: the cluster cannot hold one trial, a warm-start source is
            unusable, a scheduler budget does not fit the trials, or the study's
            result folder would be, hold or lie in the model store
            (``hpo.models.study_dir_clash``; naming ``name``).
        StudyExistsError: a study of the same name exists with another spec.
        StudyBusyError: another live driver runs this study.
        StorageError, ClusterError: storage or cluster unreachable.
    """
    results_dir = Path(results_dir)
    artifact_dir = artifact_dir or results_dir / "artifacts"
    clash = study_dir_clash(results_dir, spec.name, artifact_dir)
    if clash is not None:  # before anything is stored or started
        raise SpecError.at("name", clash)
    storage = open_storage(storage_url)
    cluster_checked = False
    runtime_env = task_code(spec.task).runtime_env()  # the task's code, unless built in
    try:  # needs the task's datasets: at every start, before anything is stored
        check_budgets(spec, new=not _stored(storage, spec.name))
    except SpecError as e:
        if not compare_spec:  # the service's own stored study: its note says why it failed
            note_failure(storage, spec, owner, public_message(str(e)))
        raise
    if not _stored(storage, spec.name):  # refuse what cannot run before storing anything
        warm_start_points(spec, storage)
        init_ray(ray_address, num_cpus, runtime_env)
        check_resources(spec)
        cluster_checked = True
    models = ModelKeeper(spec, artifact_store(artifact_dir))
    record = StudyRecord(spec, storage, listener=listener, compare_spec=compare_spec,
                         models=models)
    stopper = StopWhen(should_stop or (lambda: False), should_interrupt or (lambda: False))
    stop_rule = study_stop_rule(spec, record.study)
    board = StudyBoard(record.study, record.spec, owner)
    with DriverLease(storage, spec.name) as lease:
        board.started()
        try:
            enqueue_warm_start(record, look_up=compare_spec)  # the service's: stored
            plan = plan_trials(record)
            ended_by = None
            if plan.n_ray_trials > 0:
                if not cluster_checked:  # a stored study continued, perhaps on another cluster
                    init_ray(ray_address, num_cpus, runtime_env)
                    check_resources(spec)
                keeper = GateKeeper(gate, TrialResources.of(spec.resources))
                try:
                    ended_by = _run_tuner(spec, record, plan, results_dir, on_change, stopper,
                                          keeper, board, stop_rule)
                finally:  # trials Tune stopped with the experiment, or left to the next driver
                    keeper.release_all()
            fired = stop_rule is not None and stop_rule.reason is not None
            end = "stop_when" if fired else "user" if stopper.stopped else \
                "timeout" if ended_by == "timeout" else "budget"
            if not stopper.interrupted and (final or end != "timeout") and _holds(lease):
                record.end_waiting(end)  # the study is over: no queued point is asked now
        except Exception as e:
            board.ended(NoteEnd("FAILED", error=public_message(f"{type(e).__name__}: {e}")))
            if final and not stopper.interrupted:
                with contextlib.suppress(Exception):  # the storage may be what failed
                    if _holds(lease):
                        record.end_waiting("study_failed")
            raise
    result = outcome(record, stopped=stopper.stopped, interrupted=stopper.interrupted,
                     stop_reason=stop_rule.reason if stop_rule is not None else None)
    board.ended(note_end(result))
    return result


def _holds(lease: DriverLease) -> bool:
    """Whether this driver still holds its study; a database that does not answer then
    counts as no (the WAITING trials are left for the next driver, not the study
    failed for a moment's outage at its end)."""
    try:
        return lease.held()
    except sqlalchemy.exc.SQLAlchemyError:
        return False


def _run_tuner(spec: StudySpec, record: StudyRecord, plan: Plan, results_dir: Path,
               on_change: Callable[[StudyRecord], None] | None, stopper: StopWhen,
               keeper: GateKeeper, board: StudyBoard,
               stop_rule: StudyStopRule | None = None) -> str | None:
    """Run the trials of ``plan`` through Tune; end those it left open. Returns the
    ``stopped_by`` of those ends (``user``, ``timeout`` or the scheduler's name), ``None``
    for an interrupted driver (it leaves them to the next)."""
    def notify() -> None:
        if on_change is not None:
            on_change(record)
        board.poke()

    started, label = time.monotonic(), None
    try:
        # a stop (or interrupt) seen during the set-up starts no trial; orphans to resume
        # go through Tune, which ends them as it ends running trials
        if plan.resumes or not stopper.stop_all():
            build_tuner(spec, record, plan, results_dir, notify, stopper, keeper,
                        stop_rule).fit()
    finally:
        try:
            if not stopper.interrupted:  # an interrupted driver leaves its trials to the next
                timed_out = spec.budget.timeout_s is not None and (
                    time.monotonic() - started >= spec.budget.timeout_s)
                label = "user" if stopper.stopped else "timeout" if timed_out else \
                    spec.scheduler.name
                end_open_trials(record, label)
        finally:
            remove_pins(pins_dir(spec, results_dir))
            record.close()  # the queued result writes, also those an interrupted driver leaves
    return label


def _stored(storage, name: str) -> bool:
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Plan:
    """The trials a run of the driver will start."""

    resumes: list[Orphan]
    n_new: int

    @property
    def n_ray_trials(self) -> int:
        return len(self.resumes) + self.n_new


def plan_trials(record: StudyRecord) -> Plan:
    """Reconcile what a previous driver left RUNNING, then count the trials still to run.

    An orphan with a checkpoint on disk is resumed from it (same Optuna trial,
    its curve continued); one without is ended FAIL with the reason and its
    parameters enqueued to run again. Together with the finished trials this
    makes exactly ``budget.n_trials``: none lost, none run twice.
    """
    resumes = []
    for orphan in record.orphans():
        if record.spec.scheduler.name in POPULATION_SCHEDULERS:  # a population cannot take one back
            record.abandon(orphan, "the driver running this PBT trial stopped")
        elif orphan.checkpoint and Path(orphan.checkpoint).is_dir():
            resumes.append(orphan)
        else:  # a checkpoint recorded but gone: the results directory moved or was cleaned
            why = "and its last checkpoint is gone" if orphan.checkpoint else \
                "before its first checkpoint"
            record.requeue(orphan, f"the driver running this trial stopped {why}; its "
                                   "parameters were queued to run again")
    n_new = record.spec.budget.n_trials - record.counts().finished - len(resumes)
    return Plan(resumes=resumes, n_new=max(0, n_new))


def end_open_trials(record: StudyRecord, stopped_by: str) -> None:
    """Record an end for trials Tune stopped without a completion event (a stop of the
    whole experiment, its time budget): COMPLETE if they trained to their end, else
    PRUNED by ``stopped_by`` (also without any result yet)."""
    for ray_id in record.open_trials():
        record.stopped_running(ray_id)
        if record.trials[ray_id].stopped_by is None:
            record.note_stop(ray_id, stopped_by)
        record.complete_or_prune(ray_id, stopped_by, stopped=True)


def note_end(result: StudyOutcome) -> NoteEnd:
    """How the run ended, for the study's dashboard note."""
    status = "INTERRUPTED" if result.interrupted else "STOPPED" if result.stopped else \
        "COMPLETED"
    best = None if result.best_number is None else (result.best_number, result.best_value,
                                                    result.best_params)
    c = result.counts
    return NoteEnd(status, c.complete, c.pruned, c.failed, best,
                   len(result.pareto_front) if result.pareto_front else None,
                   stop_reason=result.stop_reason)


def study_stop_rule(spec: StudySpec, study: optuna.Study) -> StudyStopRule | None:
    """The spec's ``budget.stop_when`` over ``study`` (direction as Optuna stores it)."""
    rule = spec.budget.stop_when
    if rule is None:
        return None
    return StudyStopRule(study, metric=spec.objectives[0].metric,
                         maximize=study.direction == optuna.study.StudyDirection.MAXIMIZE,
                         target=rule.target, no_improvement_trials=rule.no_improvement_trials,
                         min_delta=rule.min_delta)


def outcome(record: StudyRecord, stopped: bool = False, interrupted: bool = False,
            stop_reason: str | None = None) -> StudyOutcome:
    """Counts and best trial of the record's study, from the storage."""
    best, front = None, []
    counts = record.counts()
    if counts.complete and record.spec.is_multi_objective:  # Optuna's front: feasible only
        front = [(t.number, list(t.values), dict(t.params)) for t in record.study.best_trials]
    elif counts.complete:
        # Study.best_trial's pick (feasible only, with constraints), of equal values the
        # first, as the study's summary says; None when no COMPLETE trial is feasible
        best = best_single([t for t in record.study.get_trials(
            deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if feasible(t)],
            record.spec.objectives[0].direction == "maximize")
    failed_reason = None
    if counts.finished and counts.failed == counts.finished:
        failed = record.study.get_trials(deepcopy=False,
                                         states=(optuna.trial.TrialState.FAIL,))
        failed_reason = str(failed[0].user_attrs.get("fail_reason", "no reason recorded")
                            if failed else "no reason recorded")
    return StudyOutcome(name=record.spec.name, counts=counts, stopped=stopped,
                        interrupted=interrupted,
                        best_number=best.number if best else None,
                        best_value=best.value if best else None,
                        best_params=dict(best.params) if best else None,
                        pareto_front=front, stop_reason=stop_reason,
                        all_failed_reason=failed_reason)
