"""The Tune function trainable: one trial runs ``trainers.fit`` and reports through Tune.

Single-worker trials run the loop in the trial's own process. Trials with
several workers launch a Ray Train ``TorchTrainer`` from inside the Tune
function (the Train v2 pattern; Ray refuses a Trainer passed to ``Tuner``):
Ray Train initializes ``torch.distributed`` (gloo on CPU, NCCL on GPU), the
loop wraps the model in DDP, and rank 0's metrics reach Tune through
``TuneReportCallback``. With ``resources.parallelism: fsdp`` the loop shards
the model with FSDP2 instead and every rank writes its shards of each
checkpoint (``trainers.dcp``) into one directory of the trial under the
study's results directory (storage every node reaches); rank 0 reports it,
and a retry or an adopting driver resumes from it as from a DDP checkpoint.

Which reports carry a checkpoint (``CheckpointPolicy``): a checkpoint costs a write,
Tune's copy to the results directory and the driver's bookkeeping, which on evaluations
a few tens of milliseconds apart is a large share of the trial's time. A single-worker
trial attaches one only where something can use it: to its last report (the kept model),
to reports at or past the scheduler's ``max_t`` (ASHA and Hyperband end the trial there),
to every report under a scheduler that pauses or exploits trials (Hyperband, median
stopping without ``hard_stop``, PBT, PB2: they resume from the newest one), and otherwise
once its training went ``checkpoint_interval_s`` (the spec's) past its last checkpoint,
for a retry or a new driver: a crash loses at most that much training plus one
evaluation, and the trial's curve goes on from the checkpoint, the steps after it
reported again with the same values. Multi-worker trials attach one to every report.

A trial that ends by itself (trained to its end, or stopped by its own early
stopping) says so: the trainer's last report carries its ``stop_reason``
(``trainers.loop``), which reaches the record with that result; a scheduler's
stop reaches it as the scheduler's decision (``hpo.tune.schedulers``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from ray import tune

import trainers
from hpo.spec import FSDP_SCRATCH_DIR, POPULATION_SCHEDULERS, StudySpec

# In a trial's config: the checkpoint an adopted trial resumes from (``hpo.tune.searcher``).
# Defined here, not in hpo.record: a trial's new worker process imports this module, and
# hpo.record's imports (Optuna's storage, SQLAlchemy, the model keeper) cost it about 1 s.
RESUME_KEY = "_hpo_resume_from"


@dataclasses.dataclass(frozen=True)
class TrialSetup:
    """What every trial of a study shares (passed once through ``tune.with_parameters``).

    ``target`` is the task class's ``module:Class``: a trial imports it from the code
    Ray shipped (``hpo.taskcode``), not through the worker's entry points; without
    it the task is looked up by its name ``task``.
    """

    task: str
    config: dict[str, Any]
    cpus: float
    gpus: float
    workers: int
    results_dir: str
    custom: dict[str, float] = dataclasses.field(default_factory=dict)
    target: str | None = None
    checkpoint_interval_s: float = 0.0  # see CheckpointPolicy; 0: every report
    checkpoint_from_step: int | None = None  # the scheduler's max_t, if below the plan

    @property
    def device(self) -> str:
        return "cuda" if self.gpus > 0 else "cpu"

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus))


@dataclasses.dataclass
class CheckpointPolicy:
    """Whether a single-worker trial's report carries a checkpoint of its step.

    Args:
        interval_s: seconds of the trial's training (wall time in this process,
            evaluations included) after which the next report carries one; 0: every
            report. Valid range 0 to 86400.
        from_step: from this step (optimizer updates) on, every report carries one
            (the scheduler's ``max_t``, where ASHA and Hyperband end a trial that then
            counts as COMPLETE and keeps its model); None: no such step.
        clock: seconds, monotonic (tests pass their own).

    The last report of a run (the trainer's ``stopping`` hook was called) always
    carries one. The interval counts from the policy's creation (the trial's start
    in this process) and from each checkpoint taken.
    """

    interval_s: float
    from_step: int | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.since = self.clock()

    def wants(self, step: int, last: bool) -> bool:
        """Whether the report of ``step`` carries a checkpoint; ``last``: the run's last."""
        return (last or self.interval_s <= 0
                or (self.from_step is not None and step >= self.from_step)
                or self.clock() - self.since >= self.interval_s)

    def taken(self) -> None:
        """A checkpoint was just written: the interval counts from now."""
        self.since = self.clock()


def checkpoint_policy(spec: StudySpec) -> dict[str, Any]:
    """``TrialSetup``'s checkpoint fields for ``spec`` (see ``CheckpointPolicy``): every
    report carries one under schedulers that pause or exploit trials (Hyperband, median
    stopping without ``hard_stop``, PBT, PB2), else one per ``checkpoint_interval_s`` of
    training, and every report from the scheduler's ``max_t`` on."""
    s = spec.scheduler
    resumes_trials = s.name in ("hyperband", *POPULATION_SCHEDULERS) or (
        s.name == "median" and not s.hard_stop)
    return {"checkpoint_interval_s": 0.0 if resumes_trials else spec.checkpoint_interval_s,
            "checkpoint_from_step": getattr(s, "max_t", None)}


class TuneReporter:
    """Forwards every evaluation to ``tune.report``, with a checkpoint of that very step
    where ``policy`` wants one (the loop then writes none of its own:
    ``checkpoints_on_request``).

    Each result also names the Ray node it ran on (``node_id``): several nodes
    of a cluster may share one IP address.
    """

    checkpoints_on_request = True  # trainers.loop: write a checkpoint only when asked

    def __init__(self, policy: CheckpointPolicy | None = None) -> None:
        import ray

        self.node_id = ray.get_runtime_context().get_node_id()
        self.stop_reason: str | None = None
        self.policy = policy or CheckpointPolicy(0.0)

    def stopping(self, reason: str) -> None:
        """The trainer's hook: the next report is the last; it carries ``stop_reason``."""
        self.stop_reason = reason

    def report(self, metrics, save_checkpoint):
        path = None
        if self.policy.wants(int(metrics.get("step", 0)), self.stop_reason is not None):
            path = save_checkpoint()
        checkpoint = tune.Checkpoint.from_directory(str(path)) if path is not None else None
        tune.report({**metrics, "node_id": self.node_id, **_stop(self)}, checkpoint=checkpoint)
        if path is not None:  # written and persisted by Tune: the interval starts again
            self.policy.taken()
        return trainers.Decision.CONTINUE


def _stop(reporter) -> dict[str, str]:
    """``{"stop_reason": ...}`` for the result after the trainer's ``stopping`` hook, once."""
    reason, reporter.stop_reason = reporter.stop_reason, None
    return {"stop_reason": reason} if reason is not None else {}


def _build(setup: TrialSetup, params: dict[str, Any], workdir: Path,
           checkpoint_dir: Path | None = None):
    torch.set_num_threads(setup.threads)
    task_cls = trainers.load_task(setup.target) if setup.target else setup.task
    task, config = trainers.create(task_cls, {**setup.config, **params, "device": setup.device},
                                   registered=setup.task)
    # a working copy: Tune copies each reported checkpoint to its storage at once
    return task, config.replace(checkpoint_dir=str(checkpoint_dir or workdir / "checkpoints"),
                                keep_last_checkpoints=1, checkpoint_fsync=False)


def _resume_point(params: dict[str, Any]) -> tuple[dict[str, Any], tune.Checkpoint | None]:
    """The trial's own parameters, and the checkpoint it continues from, if any: Tune's
    (a retry after ``max_failures``, or a PBT exploit), else the one of a trial that a
    dead driver left running (``RESUME_KEY``, set when a new driver adopts it)."""
    params = dict(params)
    adopted = params.pop(RESUME_KEY, None)
    checkpoint = tune.get_checkpoint()
    if checkpoint is None and adopted:
        checkpoint = tune.Checkpoint(adopted)
    return params, checkpoint


def train_trial(params: dict[str, Any], setup: TrialSetup) -> None:
    """The Tune function trainable of a single-worker trial."""
    if setup.workers > 1:
        return train_trial_distributed(params, setup)
    workdir = Path(tempfile.mkdtemp(prefix="hpo-trial-"))
    try:
        params, checkpoint = _resume_point(params)
        task, config = _build(setup, params, workdir)
        resume = checkpoint.to_directory(str(workdir / "resume")) if checkpoint else None
        policy = CheckpointPolicy(setup.checkpoint_interval_s, setup.checkpoint_from_step)
        with _exit_as_error():
            trainers.fit(task, config, TuneReporter(policy), resume_from=resume)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _exit_as_error() -> Iterator[None]:
    """A task's ``sys.exit(code)`` as an error naming it: Ray takes a non-zero exit of the
    trainable's thread for its actor's death ("The actor died unexpectedly", helper-41).
    ``sys.exit(0)`` passes: it is how ``tune.report`` stops a trial's thread
    (``ray.train._internal.session``); a bare ``sys.exit()`` does not, Ray's thread runner
    (``ray.air._internal.util.RunnerThread``) taking only code 0 for a clean stop."""
    try:
        yield
    except SystemExit as e:
        if e.code == 0:  # Ray's own stop; None is no clean stop to Ray (helper-43)
            raise
        call = "sys.exit()" if e.code is None else f"sys.exit({e.code!r})"
        raise RuntimeError(f"the task's code called {call}") from None


# -- several workers: Ray Train inside the Tune trial -------------------------------------


class TrainReporter:
    """Forwards every evaluation to ``ray.train.report`` (rank 0 attaches the checkpoint).

    Rank 0 also reports its worker group's placement group id, so that the
    driver can release it if Tune stops the trial: Ray Train leaks it otherwise
    when the Ray state API is unavailable (seen with ray 2.60).
    """

    stop_reason: str | None = None

    def stopping(self, reason: str) -> None:
        """The trainer's hook: the next report is the last; it carries ``stop_reason``."""
        self.stop_reason = reason

    def report(self, metrics, save_checkpoint):
        import ray.train
        import ray.util

        path = save_checkpoint()
        extra = _stop(self)
        if ray.train.get_context().get_world_rank() == 0:
            group = ray.util.get_current_placement_group()
            if group is not None:
                extra["train_pg_id"] = group.id.hex()
        checkpoint = ray.train.Checkpoint.from_directory(str(path)) if path else None
        ray.train.report({**metrics, **extra}, checkpoint=checkpoint)
        return trainers.Decision.CONTINUE


def _train_worker(loop_config: dict[str, Any]) -> None:
    import ray.train

    setup: TrialSetup = loop_config["setup"]
    workdir = Path(tempfile.mkdtemp(prefix="hpo-worker-"))
    try:
        # FSDP: every rank writes its shards into the one directory of the trial
        task, config = _build(setup, loop_config["params"], workdir, loop_config["shared"])
        # Ray Train's own restart, else where the Tune trial continues from
        checkpoint = ray.train.get_checkpoint() or loop_config["resume"]
        resume = checkpoint.to_directory(str(workdir / "resume")) if checkpoint else None
        with _exit_as_error():
            trainers.fit(task, config, TrainReporter(), resume_from=resume)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def train_trial_distributed(params: dict[str, Any], setup: TrialSetup) -> None:
    """Run the trial as a DDP (or FSDP) job of ``setup.workers`` Ray Train workers."""
    import ray.train
    from ray.tune.integration.ray_train import TuneReportCallback

    from hpo.ray_private import TorchTrainerWithoutCleaner

    trial_id = tune.get_context().get_trial_id()
    params, resume = _resume_point(params)
    shared = None
    if setup.config.get("parallelism") == "fsdp":
        # a retry of the trial (another process) starts a directory of its own
        shared = fsdp_scratch(Path(setup.results_dir)) / trial_id / uuid.uuid4().hex[:8]
    per_worker = {"CPU": setup.cpus, **({"GPU": setup.gpus} if setup.gpus > 0 else {}),
                  **setup.custom}
    trainer = TorchTrainerWithoutCleaner(
        _train_worker,
        train_loop_config={"params": params, "setup": setup, "resume": resume,
                           "shared": shared},
        scaling_config=ray.train.ScalingConfig(num_workers=setup.workers,
                                               use_gpu=setup.gpus > 0,
                                               resources_per_worker=per_worker),
        run_config=ray.train.RunConfig(name=f"train-{trial_id}",
                                       storage_path=setup.results_dir,
                                       # the newest is what a retry or a new driver
                                       # resumes from; one older in case it is torn
                                       checkpoint_config=ray.train.CheckpointConfig(
                                           num_to_keep=2),
                                       callbacks=[TuneReportCallback()]),
    )
    try:
        trainer.fit()
    finally:  # Ray Train keeps its own copies of the reported checkpoints. A trial that
        # Tune stops (a scheduler's decision) has its actor killed before this runs: the
        # driver's ScratchCleanup removes its directory then.
        if shared is not None:
            shutil.rmtree(shared.parent, ignore_errors=True)


def fsdp_scratch(results_dir: Path) -> Path:
    """Where FSDP trials' ranks write their sharded checkpoints, one directory per trial."""
    return results_dir / FSDP_SCRATCH_DIR


class ScratchCleanup(tune.Callback):
    """Removes an FSDP trial's working directory (``fsdp_scratch``) when Tune ends the
    trial (completed or stopped, or failed for good) and, at the run's end, every one of
    the run's trials: Tune kills a stopped trial's actor, so the trial's own ``finally``
    does not run. A retry, a resumed PBT member or a later driver resumes from Ray Train's
    persisted copy of the checkpoint, never from this directory.

    Args:
        root: ``fsdp_scratch(results_dir)`` of the run (shared by every study using the
            results directory: only this run's trials' directories are removed).
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _remove(self, trial) -> None:
        shutil.rmtree(self.root / trial.trial_id, ignore_errors=True)

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._remove(trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._remove(trial)

    def on_experiment_end(self, trials, **info):
        for trial in trials:
            self._remove(trial)
