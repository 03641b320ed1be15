"""What a checkpoint holds of a run, and how a fresh run is resumed from it.

:func:`run_state` is the content of ``state.pt`` (``trainers.checkpoint`` writes
it); :func:`restore` loads it into a freshly built :class:`~trainers.components.Run`
under the rule documented in ``trainers.checkpoint``: the checkpoint gives the
run's *state*, the config gives every *hyperparameter*.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainers.components import Run, total_steps
from trainers.ema import EMA
from trainers.errors import CheckpointError, ConfigError, misfit
from trainers.fields import to_dict
from trainers.rng import restore_rng
from trainers.schedules import schedule_factor

CHECKPOINT_FORMAT = 1


@dataclasses.dataclass
class TrainState:
    """Counters that survive a restart (saved in every checkpoint)."""

    step: int = 0                 # optimizer updates applied
    epoch: int = 0                # current epoch, 0-based
    position: int = 0             # samples of this epoch already consumed by this rank
    skipped_updates: int = 0
    skipped_in_a_row: int = 0
    samples: int = 0              # training samples processed, all ranks
    best_value: float | None = None
    best_step: int | None = None
    evals_without_improvement: int = 0
    stop_reason: str | None = None


@dataclasses.dataclass
class Window:
    """Training statistics since the last evaluation (checkpointed: ``train_loss``
    spans a resume)."""

    loss_sum: float = 0.0
    items: int = 0
    samples: int = 0
    seconds: float = 0.0
    grad_norm: float = float("nan")


@dataclasses.dataclass
class Restored:
    """What a checkpoint gives the loop besides the components' own states."""

    window: Window = dataclasses.field(default_factory=Window)
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    last_eval: tuple[int, int] | None = None  # (step, samples) of the last evaluation


def run_state(run: Run, state: TrainState, window: Window, history: list[dict[str, float]],
              last_eval: tuple[int, int] | None, rng: list[Any] | None,
              sharded: bool = False, windows: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    """The content of a checkpoint's ``state.pt``: tensors and plain Python values.

    Args:
        history: every evaluation's metrics so far (a resumed run returns them).
        last_eval: ``(step, samples)`` of the last evaluation, so that a resume at
            that very position does not evaluate and report it as a new one.
        rng: every rank's RNG states (``trainers.rng.capture_rng``), by rank.
        windows: every rank's metrics window (``dataclasses.asdict(Window)``), by rank;
            ``window`` is this rank's (rank 0's, the one that writes), kept for older readers.
        sharded: leave out the model, optimizer and EMA weights (a sharded
            checkpoint writes them with DCP, ``trainers.dcp``) and keep the
            EMA's update count only.
    """
    if sharded:
        ema = {"n_updates": run.ema.n_updates} if run.ema is not None else None
        return {**_common_state(run, state, window, history, last_eval, rng, windows),
                "ema": ema}
    return {
        **_common_state(run, state, window, history, last_eval, rng, windows),
        "model": run.model.state_dict(),
        "optimizer": run.optimizer.state_dict(),
        "ema": run.ema.state_dict() if run.ema is not None else None,
    }


def _common_state(run: Run, state: TrainState, window: Window, history: list[dict[str, float]],
                  last_eval: tuple[int, int] | None, rng: list[Any] | None,
                  windows: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {
        "format": CHECKPOINT_FORMAT,
        "task": run.task.name,
        "options": to_dict(run.task.options),
        "config": to_dict(run.config),
        "world_size": run.dist.world_size,
        "scheduler": run.scheduler.state_dict(),
        "scaler": run.scaler.state_dict(),
        "trainer": dataclasses.asdict(state),
        "window": dataclasses.asdict(window),
        "history": history,
        "last_eval": list(last_eval) if last_eval is not None else None,
        "rng": rng,
        "windows": windows,
    }


def restore(run: Run, state: TrainState, saved: dict[str, Any]) -> Restored:
    """Load a checkpoint's state into a freshly built run; return what the loop resumes with.

    The checkpoint gives the state, the config every hyperparameter (see
    ``trainers.checkpoint``). ``state`` is filled in place; its ``stop_reason``
    is cleared (a reporter's stop is the outside's decision, e.g. a scheduler
    pausing a trial: resuming overrides it), while the loop checks the run's own
    stop conditions against the restored counters before it trains.

    Raises:
        CheckpointError: the checkpoint is incomplete, or does not fit this
            run (another model, optimizer or number of ranks).
    """
    try:
        _check_compatible(run, saved)
        run.model.load_state_dict(saved["model"])
        run.optimizer.load_state_dict(saved["optimizer"])
        run.scheduler.load_state_dict(saved["scheduler"])
        if saved["scaler"]:
            run.scaler.load_state_dict(saved["scaler"])
        if run.ema is not None and saved["ema"] is not None:
            run.ema.load_state_dict(saved["ema"])
        elif run.ema is not None:  # EMA switched on at resume: start from the loaded weights
            run.ema = EMA(run.model, run.config.ema_decay)
        return restore_loop_state(run, state, saved)
    except (CheckpointError, ConfigError):
        raise
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        raise CheckpointError(misfit("the checkpoint", e)) from e


def restore_loop_state(run: Run, state: TrainState, saved: dict[str, Any]) -> Restored:
    """The part of :func:`restore` after the components' weights: the config's
    hyperparameters, the counters, the RNG states of this rank (when the checkpoint
    has one for it), the metrics window and history.

    Raises:
        KeyError, TypeError: the checkpoint lacks a part.
    """
    trainer, rng, window = saved["trainer"], saved["rng"], saved.get("window")
    windows = saved.get("windows")
    if windows is not None and len(windows) == run.dist.world_size:
        window = windows[run.dist.rank]  # this rank's own (a checkpoint of before: rank 0's)
    watched = saved["config"].get("early_stopping_metric") or run.task.objective
    last_eval = tuple(saved["last_eval"]) if saved.get("last_eval") else None
    restored = Restored(Window(**window) if window else Window(),
                        list(saved.get("history") or []), last_eval)
    respan_schedule(run, trainer)
    apply_config_hyperparameters(run)
    for key, value in trainer.items():
        setattr(state, key, value)
    state.stop_reason = None
    if watched != run.early_stopping_metric:  # early stopping now watches another metric
        state.best_value, state.best_step, state.evals_without_improvement = None, None, 0
    if rng is not None and len(rng) == run.dist.world_size:
        restore_rng(rng[run.dist.rank])
    return restored


def respan_schedule(run: Run, trainer: dict[str, Any]) -> None:
    """The schedule (and ``run.total_steps``, the ``planned_updates`` reported) of a resumed
    run spans the updates it applied plus those its rest takes at its config's
    micro-batch size and accumulation (:func:`trainers.components.total_steps`). With the
    sizes the run had all along this is the span the uninterrupted run has at that
    point, to the update (:func:`respan`); after a resume that changed them (PBT's exploit
    of ``micro_batch_size``), every later resume keeps to it too, where a span counted
    from zero at the new sizes could end before the step (an LR of 0 from there:
    helper-32's finding, and helper-34's for the resume after it)."""
    respan(run, trainer["step"], trainer["epoch"], trainer["position"])


def respan(run: Run, applied: int, epoch: int, position: int) -> None:
    """Span the schedule over ``applied`` updates plus the update groups left from
    ``position`` samples into ``epoch`` (0-based), within ``max_updates``, and set the
    optimizer's LR at the schedule's position. The loop calls it at every fp16 update
    skipped for overflow: in a run bound by ``max_epochs`` a skipped group is one
    update fewer, and a span counted in groups ended the run before its decay did
    (helper-38: cosine to ``min_lr_ratio`` 0.1 ended at 0.378 after 6 skips of 20)."""
    c = run.config
    run.total_steps = total_steps(c, run.samples_per_rank, applied, epoch, position)
    sched = run.scheduler
    sched.lr_lambdas = [schedule_factor(c, run.total_steps) for _ in run.optimizer.param_groups]
    for group, base, factor in zip(run.optimizer.param_groups, sched.base_lrs,
                                   sched.lr_lambdas, strict=True):
        group["lr"] = base * factor(sched.last_epoch)


def apply_config_hyperparameters(run: Run) -> None:
    """Make the optimizer and schedule follow ``run.config`` after loading a checkpoint.

    ``optimizer.load_state_dict`` restores the saved group hyperparameters; a run
    resumed with a changed LR, weight decay, betas or momentum (PBT's
    exploit-and-explore) must use the new ones, from the same position in the
    schedule. ``initial_lr`` (what a scheduler built at a later position would
    start from) follows ``lr`` too.
    """
    c = run.config
    decays = [c.weight_decay, 0.0]
    for group, decay in zip(run.optimizer.param_groups, decays, strict=True):
        group["weight_decay"] = decay
        group["initial_lr"] = c.lr
        if c.optimizer == "sgd":
            group["momentum"] = c.momentum
        else:
            group["betas"] = (c.adam_beta1, c.adam_beta2)
    sched = run.scheduler
    sched.base_lrs = [c.lr for _ in run.optimizer.param_groups]
    factor = sched.lr_lambdas[0](sched.last_epoch)
    for group in run.optimizer.param_groups:
        group["lr"] = c.lr * factor


def _check_compatible(run: Run, saved: dict[str, Any]) -> None:
    if saved.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"unsupported checkpoint format {saved.get('format')!r}")
    if saved["world_size"] != run.dist.world_size:
        raise CheckpointError(f"checkpoint was written by {saved['world_size']} ranks, "
                              f"this run has {run.dist.world_size}")
    check_same_run(run, saved)


def check_same_run(run: Run, saved: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint under a config that makes it another run: another
    optimizer (its state does not fit), another ``seed`` (the epoch under way would be
    shuffled anew from the same position: samples skipped and seen twice), or another
    value of a task option outside ``Task.mutable_options`` (the data split, the
    model's shape: e.g. ``split_seed`` would validate on images already trained on).
    Options that are paths (``option(path=True)``) may differ: where the data lies is
    not which run it is. Every hyperparameter may change (the rule of
    ``trainers.checkpoint``), and so may the mutable options (PBT's).

    Raises:
        CheckpointError: another optimizer.
        ConfigError: another seed or task option, naming it.
    """
    before = saved["config"]["optimizer"]
    if before != run.config.optimizer:
        raise CheckpointError(f"checkpoint holds {before} optimizer state; it cannot resume "
                              f"with optimizer={run.config.optimizer}")
    task = run.task
    fixed = {f.name for f in task.fields() if not f.path} - set(task.mutable_options)
    now = {"seed": run.config.seed} | {k: v for k, v in to_dict(task.options).items()
                                       if k in fixed}
    was = {"seed": saved["config"].get("seed", run.config.seed)} | dict(
        saved.get("options") or {})
    for name, value in now.items():
        if name in was and was[name] != value:
            mutable = ", ".join(sorted(task.mutable_options)) or "none of the task's options"
            raise ConfigError(name, f"the checkpoint was made with {name}={was[name]!r}, this "
                                    f"run has {value!r}: a resume keeps the seed and the "
                                    f"task's options (it may change {mutable} and the "
                                    f"training hyperparameters)")
