"""The training loop: ``fit(task, config, reporter, resume_from) -> TrainResult``.

One optimizer update ("step") consumes one accumulation group of
``grad_accum_steps`` micro-batches (fewer at the end of an epoch). Each
micro-batch's summed loss is divided by the number of items (samples, or real
tokens) of the *whole group across all ranks*, so the accumulated gradient is
exactly the gradient of the group's mean loss, whatever the micro-batch size,
the number of accumulation steps or of ranks. Under DDP the gradients are
synchronized only on the last micro-batch of a group (``no_sync()``); under
FSDP (``parallelism: fsdp``) likewise, through FSDP2's gradient-sync switch
(``trainers.fsdp``), and checkpoints are sharded (``trainers.dcp``). Every rank
takes rank 0's buffers (BatchNorm's running statistics, which each rank updates
from its own samples) before the EMA update, an evaluation and a checkpoint
(``trainers.distributed.broadcast_buffers``), so the ranks hold one model.

After backward: the loss scaler unscales the gradients (fp16), the global norm
is measured and clipped, then either

* the update is applied: optimizer, LR scheduler and EMA step once; or
* fp16 found inf/NaN: the scaler skips the update and backs off its scale;
  nothing else moves, and ``skipped_updates`` counts it; or
* outside fp16 a non-finite loss or gradient norm raises ``NonFiniteError``
  before anything is applied.

Metrics reported at every evaluation (``Reporter.report``):

=====================  ==========================================================
``step``               optimizer updates applied so far
``planned_updates``    updates the run makes if nothing stops it early
``epoch``              epochs completed, fractional (3.5 = half-way through the 4th)
``train_loss``         mean loss per item over the updates since the last evaluation
``<task metrics>``     the task's evaluation metrics (``val_loss``, ...)
``lr``                 the learning rate of the next update
``grad_norm``          unclipped, unscaled global gradient L2 norm of the last update
``loss_scale``         the fp16 loss scale (1.0 without fp16)
``skipped_updates``    fp16 updates skipped for overflow, in total
``samples``            training samples processed so far, all ranks
``samples_per_s``      training throughput since the last evaluation, all ranks
``tokens_per_s``       the same in tokens (token tasks only)
``peak_memory_bytes``  peak CUDA memory allocated, or the process's peak RSS on CPU;
                       under FSDP also ``peak_memory_bytes_rank<r>``, each rank's own
``time_s``             seconds since ``fit`` started
``stopping(reason)``   not a metric: a reporter's optional hook, called just before the run's
                       last report with why it stops (``max_updates``,
                       ``max_epochs``, ``early_stopping``), as ``TrainResult`` says;
                       absent when the reporter itself stops the run
=====================  ==========================================================
"""

from __future__ import annotations

import dataclasses
import math
import resource
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainers import checkpoint as ckpt
from trainers import dcp
from trainers.checkpoint_read import load_checkpoint
from trainers.components import Run, build_run, move_to
from trainers.config import TrainConfig
from trainers.data import batch_seeds, epoch_order, grouped, loader, micro_batches
from trainers.distributed import (
    all_reduce_max,
    all_reduce_sums,
    broadcast_buffers,
    broadcast_flag,
    gather_objects,
)
from trainers.errors import NonFiniteError, TrainersError
from trainers.evaluation import evaluate
from trainers.fields import to_dict
from trainers.fsdp import clip_grad_norm
from trainers.precision import MAX_SKIPPED_IN_A_ROW
from trainers.reporting import Decision, NullReporter, Reporter
from trainers.resume import Restored, TrainState, Window, respan, restore, run_state
from trainers.rng import capture_rng
from trainers.tasks.base import Task

LOOP_METRICS = frozenset({
    "step", "planned_updates", "epoch", "train_loss", "lr", "grad_norm", "loss_scale",
    "skipped_updates", "samples", "samples_per_s", "tokens_per_s", "peak_memory_bytes",
    "time_s"})
"""What the loop reports at every evaluation besides the task's metrics (the table above;
``tokens_per_s`` for token tasks only, ``peak_memory_bytes_rank<r>`` under FSDP too)."""


@dataclasses.dataclass
class TrainResult:
    """What ``fit`` returns.

    Attributes:
        metrics: the last evaluation's metrics (also the last report).
        history: the metrics of every evaluation, in order (a resumed run's
            includes those before its checkpoint).
        n_updates: optimizer updates applied.
        stop_reason: ``max_updates``, ``max_epochs``, ``early_stopping`` or ``reporter``.
        best_metric / best_value / best_step: the early-stopping metric's best
            evaluation (``best_value`` is None if no evaluation was finite).
        checkpoint_dir: the checkpoint root, if checkpoints were written.
        model: the trained raw module (not DDP-wrapped; under FSDP the sharded module,
            see ``trainers.fsdp.full_parameters``); ema_model: its EMA, if any.
    """

    metrics: dict[str, float]
    history: list[dict[str, float]]
    n_updates: int
    stop_reason: str
    best_metric: str
    best_value: float | None
    best_step: int | None
    checkpoint_dir: Path | None
    model: nn.Module
    ema_model: nn.Module | None


def fit(task: Task, config: TrainConfig, reporter: Reporter | None = None,
        resume_from: str | Path | None = None) -> TrainResult:
    """Train ``task`` under ``config``; report at every evaluation.

    Args:
        task: the model, data and loss (``trainers.tasks.create`` builds one).
        config: the run's configuration.
        reporter: receives the metrics of every evaluation and may stop the run
            or ask for a checkpoint; default: none.
        resume_from: a checkpoint directory, or a checkpoint root (its newest
            checkpoint is used). Same config: the run continues bit for bit as
            if never interrupted (fp32, CPU), and a stop condition already met
            there (early stopping's patience exhausted, ``max_updates``,
            ``max_epochs``) ends it at once with the uninterrupted run's result;
            its last evaluation is then reported again, as the new reporter may
            never have seen it (a trial adopted by a new driver). A changed
            config (PBT) keeps model, optimizer state and schedule position and
            takes the new hyperparameters (the rule: ``trainers.checkpoint``).

    Returns:
        The final metrics, the history of evaluations and the trained model.

    Raises:
        ConfigError: the config does not suit the task or the machine, or it changes
            the ``seed`` or a fixed task option of the checkpoint it resumes.
        NonFiniteError: a NaN/inf loss or gradient norm outside fp16 scaling.
        TrainersError: the training set of an epoch to train, or the validation set, is
            empty.
        CheckpointError: ``resume_from`` holds no usable checkpoint.
    """
    reporter = reporter or NullReporter()
    run = build_run(task, config)
    state = TrainState()
    restored = Restored()
    if resume_from is not None and run.sharded_checkpoints:
        restored = dcp.restore(run, state, Path(resume_from))
    elif resume_from is not None:
        agree = (lambda offer: gather_objects(offer, run.dist)) if run.dist.enabled else None
        restored = restore(run, state, load_checkpoint(Path(resume_from), agree=agree))
    loop = _Loop(run, state, reporter, restored)
    if resume_from is not None:
        loop.remark_restored_best()
    loop.train()
    return TrainResult(
        metrics=loop.history[-1] if loop.history else {}, history=loop.history,
        n_updates=state.step, stop_reason=state.stop_reason or "max_updates",
        best_metric=run.early_stopping_metric, best_value=state.best_value,
        best_step=state.best_step, checkpoint_dir=run.checkpoint_root, model=run.model,
        ema_model=run.ema.module if run.ema else None,
    )


class _Loop:
    """The loop's mutable state and its three actions: update, evaluate, checkpoint."""

    def __init__(self, run: Run, state: TrainState, reporter: Reporter,
                 restored: Restored) -> None:
        self.run, self.state, self.reporter = run, state, reporter
        self.window = restored.window
        self.history = list(restored.history)
        self.n_restored_evals = len(self.history)
        self.started = time.perf_counter()
        self.last_eval = restored.last_eval
        self.rng_snapshot: list[Any] | None = None
        self.window_snapshot: list[dict[str, Any]] | None = None  # every rank's, by rank
        # a reporter that decides itself which reports carry a checkpoint
        # (``checkpoints_on_request``) gets one only through ``save_checkpoint``
        self.eager_checkpoints = run.checkpoint_root is not None and not getattr(
            reporter, "checkpoints_on_request", False)
        if run.dist.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(run.dist.device)

    # -- the loop ---------------------------------------------------------------------

    def train(self) -> None:
        run, state, c = self.run, self.state, self.run.config
        run.model.train()
        while state.stop_reason is None:
            state.stop_reason = self._limit_reached()
            if state.stop_reason is not None:
                break
            if hasattr(run.train_set, "set_epoch"):
                run.train_set.set_epoch(state.epoch)
            if len(run.train_set) == 0:  # an epoch of no update: max_updates never comes
                raise TrainersError(f"the training set of task {run.task.name!r} is empty "
                                    f"(epoch {state.epoch})")
            order = epoch_order(run.train_set, seed=c.seed, epoch=state.epoch,
                                rank=run.dist.rank, world_size=run.dist.world_size)
            batches = micro_batches(order[state.position:], c.micro_batch_size)
            seeds = batch_seeds(seed=c.seed, epoch=state.epoch, rank=run.dist.rank, offsets=range(
                state.position, len(order), c.micro_batch_size)) if c.num_workers else None
            data = loader(run.train_set, batches, run.task.collate, num_workers=c.num_workers,
                          pin_memory=run.dist.device.type == "cuda", seeds=seeds)
            for group in grouped(iter(data), c.grad_accum_steps):
                applied = self._update(group)
                if applied:
                    self._after_update()
                if state.stop_reason is None and c.max_updates is not None \
                        and state.step >= c.max_updates:
                    state.stop_reason = "max_updates"
                if state.stop_reason is not None:
                    break
            else:
                state.epoch += 1
                state.position = 0
                if c.eval_interval is None:
                    self._evaluate_and_report()
        if self.last_eval != self._position_key():
            self._evaluate_and_report()
        elif self.history and len(self.history) == self.n_restored_evals:
            self._report_last_again()

    def _limit_reached(self) -> str | None:
        """The stop condition met before the next update, if any.

        Early stopping's patience is checked here too: a run resumed from the
        checkpoint of the evaluation that exhausted it has nothing left to train.
        """
        c, state = self.run.config, self.state
        if self._patience_exhausted():
            return "early_stopping"
        if c.max_epochs is not None and state.epoch >= c.max_epochs:
            return "max_epochs"
        if c.max_updates is not None and state.step >= c.max_updates:
            return "max_updates"
        return None

    def _told(self, metrics: dict[str, Any]) -> dict[str, Any]:
        """The report of an evaluation: its metrics; before the run's last one, a reporter
        with the optional hook ``stopping(reason)`` is told why the run stops."""
        reason = self._stops_after_this_evaluation()
        hook = getattr(self.reporter, "stopping", None)
        if reason is not None and hook is not None:
            hook(reason)
        return dict(metrics)

    def _stops_after_this_evaluation(self) -> str | None:
        """Why the run stops right after the evaluation just made, if it does: the stop
        ``train`` then sets, in its order (see there), known before the report.

        Inside an epoch (an evaluation after an update) ``max_updates`` is checked
        first, then the end of the last epoch if this update consumed its last
        batch; at an epoch's end (``position`` 0) ``max_epochs`` comes first.
        """
        c, state = self.run.config, self.state
        if state.stop_reason is not None:  # the final evaluation, or a resume's report
            return state.stop_reason
        if self._patience_exhausted():
            return "early_stopping"
        updates_done = c.max_updates is not None and state.step >= c.max_updates
        if state.position == 0:
            epochs_done = c.max_epochs is not None and state.epoch >= c.max_epochs
            return "max_epochs" if epochs_done else "max_updates" if updates_done else None
        last_batch = state.position >= self.run.samples_per_rank
        epochs_done = last_batch and c.max_epochs is not None and state.epoch + 1 >= c.max_epochs
        return "max_updates" if updates_done else "max_epochs" if epochs_done else None

    def _patience_exhausted(self) -> bool:
        patience = self.run.config.early_stopping_patience
        return patience is not None and self.state.evals_without_improvement >= patience

    def _position_key(self) -> tuple[int, int]:
        return (self.state.step, self.state.samples)

    def _after_update(self) -> None:
        c, step = self.run.config, self.state.step
        if c.eval_interval is not None and step % c.eval_interval == 0:
            self._evaluate_and_report()
        elif self.eager_checkpoints and c.checkpoint_interval is not None \
                and step % c.checkpoint_interval == 0:
            broadcast_buffers(self.run.model, self.run.dist)  # every rank resumes rank 0's
            self._snapshot_rng()
            self._save(self._meta())

    # -- one optimizer update -----------------------------------------------------------

    def _update(self, group: list[Any]) -> bool:
        """Forward and backward over one accumulation group, then step; True if applied."""
        run, state, task = self.run, self.state, self.run.task
        t0 = time.perf_counter()
        group = [move_to(b, run.dist.device) for b in group]
        n_items = sum(task.n_items(b) for b in group)
        n_samples = sum(task.n_samples(b) for b in group)
        counts = all_reduce_sums({"items": n_items, "samples": n_samples}, run.dist)
        scale = run.dist.world_size / counts["items"]
        loss_sum = torch.zeros((), device=run.dist.device)
        for i, batch in enumerate(group):
            last = i == len(group) - 1
            with run.grad_sync(last):
                with run.autocast():
                    micro_loss = task.loss_sum(run.train_model, batch)
                run.scaler.scale(micro_loss.float() * scale).backward()
            loss_sum += micro_loss.detach().float()
        state.position += n_samples
        run.scaler.unscale_(run.optimizer)
        grad_norm_t = clip_grad_norm(run.model, run.config.max_grad_norm)
        local_loss, grad_norm = torch.stack([loss_sum, grad_norm_t.float()]).tolist()
        if not run.scaler.is_enabled():
            self._check_finite(local_loss, grad_norm)
        scale_before = run.scaler.get_scale()
        run.scaler.step(run.optimizer)
        run.scaler.update()
        applied = not run.scaler.is_enabled() or run.scaler.get_scale() >= scale_before
        run.optimizer.zero_grad(set_to_none=True)
        state.samples += int(counts["samples"])
        if applied:
            run.scheduler.step()
            if run.ema is not None:
                broadcast_buffers(run.model, run.dist)  # the EMA folds in rank 0's
                run.ema.update(run.model)
            state.step += 1
            state.skipped_in_a_row = 0
            w = self.window
            w.loss_sum += local_loss
            w.items += n_items
            w.samples += int(counts["samples"])
            w.grad_norm = grad_norm
        else:
            state.skipped_updates += 1
            state.skipped_in_a_row += 1
            if state.skipped_in_a_row > MAX_SKIPPED_IN_A_ROW:
                raise NonFiniteError(state.step + 1, "grad_norm", grad_norm,
                                     skipped_in_a_row=state.skipped_in_a_row,
                                     loss_scale=run.scaler.get_scale())
            respan(run, state.step, state.epoch, state.position)
        self.window.seconds += time.perf_counter() - t0
        return applied

    def _check_finite(self, loss: float, grad_norm: float) -> None:
        bad = 0.0 if math.isfinite(loss) and math.isfinite(grad_norm) else 1.0
        if all_reduce_max(bad, self.run.dist) > 0:
            step = self.state.step + 1
            if not math.isfinite(loss):
                raise NonFiniteError(step, "loss", loss)
            raise NonFiniteError(step, "grad_norm", grad_norm)

    # -- evaluation and reporting -------------------------------------------------------

    def _evaluate_and_report(self) -> None:
        run, state, c = self.run, self.state, self.run.config
        eval_model = run.ema.module if run.ema is not None and c.eval_with_ema else run.model
        # every rank evaluates, and the checkpoint keeps, rank 0's buffers (one model's)
        broadcast_buffers(run.model, run.dist)
        metrics = self._train_metrics()
        metrics.update(evaluate(run.task, eval_model, run.val_set, run.dist, run.autocast,
                                c.eval_batch_size or c.micro_batch_size))
        run.model.train()
        is_best = self._track_best(metrics[run.early_stopping_metric])
        self.history.append(metrics)
        self.last_eval = self._position_key()
        self._snapshot_rng()
        meta = self._meta(metrics)
        saved: Path | None = None
        wrote = False  # under FSDP only rank 0 gets the path, but every rank wrote
        if self.eager_checkpoints and (c.checkpoint_interval is None or is_best or (
                c.checkpoint_interval is not None and state.step % c.checkpoint_interval == 0)):
            saved, wrote = self._save(meta), True
            if is_best and run.dist.is_main:
                ckpt.mark_best(run.checkpoint_root, state.step, run.early_stopping_metric,
                               state.best_value, durable=c.checkpoint_fsync,
                               keep_last=c.keep_last_checkpoints)
        # the reporter's checkpoint of this step is the one just written, if any
        decision = self.reporter.report(self._told(metrics),
                                        lambda: saved if wrote else self._save(meta))
        if broadcast_flag(decision is Decision.STOP, run.dist):
            state.stop_reason = "reporter"
        elif self._patience_exhausted():
            state.stop_reason = "early_stopping"

    def _report_last_again(self) -> None:
        """Report the restored last evaluation again (a resume with nothing left to train).

        The reporter may be a new one that never saw it (a trial adopted by a new
        driver needs a final result); the run stops whatever it decides.
        """
        self._snapshot_rng()
        metrics = self.history[-1]
        meta = self._meta(metrics)
        self.reporter.report(self._told(metrics), lambda: self._save(meta))

    def _train_metrics(self) -> dict[str, float]:
        run, state, w = self.run, self.state, self.window
        sums = all_reduce_sums({"loss": w.loss_sum, "items": w.items}, run.dist)
        seconds = all_reduce_max(w.seconds, run.dist)
        metrics = {
            "step": state.step,
            "planned_updates": run.total_steps,
            "epoch": state.epoch + state.position / max(1, run.samples_per_rank),
            "train_loss": sums["loss"] / sums["items"] if sums["items"] else float("nan"),
            "lr": run.optimizer.param_groups[0]["lr"],
            "grad_norm": w.grad_norm,
            "loss_scale": run.scaler.get_scale() if run.scaler.is_enabled() else 1.0,
            "skipped_updates": state.skipped_updates,
            "samples": state.samples,
            "samples_per_s": w.samples / seconds if seconds > 0 else float("nan"),
            "peak_memory_bytes": _peak_memory_bytes(run.dist.device),
            "time_s": time.perf_counter() - self.started,
        }
        if run.sharded_checkpoints and run.dist.enabled:
            peaks = gather_objects(metrics["peak_memory_bytes"], run.dist)
            metrics.update({f"peak_memory_bytes_rank{r}": p for r, p in enumerate(peaks)})
        if run.task.item_unit == "token":
            metrics["tokens_per_s"] = sums["items"] / seconds if seconds > 0 else float("nan")
        self.window = Window(grad_norm=w.grad_norm)
        return metrics

    def _track_best(self, value: float) -> bool:
        """Update the early-stopping state with one evaluation; True if it is the best."""
        state, c = self.state, self.run.config
        maximize = self.run.task.metrics[self.run.early_stopping_metric] == "maximize"
        signed = value if maximize else -value
        best = None if state.best_value is None else (
            state.best_value if maximize else -state.best_value)
        improved = math.isfinite(value) and (
            best is None or signed > best + c.early_stopping_min_delta)
        if improved:
            state.best_value, state.best_step = value, state.step
            state.evals_without_improvement = 0
        else:
            state.evals_without_improvement += 1
        return improved

    # -- checkpoints --------------------------------------------------------------------

    def remark_restored_best(self) -> None:
        """After a resume: ``best.json`` names the restored state's best checkpoint
        (``checkpoint.remark_best``: a kill between the two writes of a new best)."""
        run, state = self.run, self.state
        if (self.eager_checkpoints and run.dist.is_main and state.best_step is not None
                and state.best_value is not None):
            ckpt.remark_best(run.checkpoint_root, state.best_step, run.early_stopping_metric,
                             state.best_value, resumed_at=state.step, run=self._meta(),
                             durable=run.config.checkpoint_fsync,
                             keep_last=run.config.keep_last_checkpoints)

    def _snapshot_rng(self) -> None:
        self.rng_snapshot = gather_objects(capture_rng(), self.run.dist)
        # each rank's own training-loss window: a resumed rank continues its own, so the
        # next train_loss sums what the uninterrupted ranks would (rank 0's alone, taken
        # by every rank, counted it world_size times)
        self.window_snapshot = gather_objects(dataclasses.asdict(self.window), self.run.dist)

    def _meta(self, metrics: dict[str, float] | None = None) -> dict[str, Any]:
        s = self.state
        return {"step": s.step, "epoch": s.epoch, "position": s.position,
                "task": self.run.task.name, "config": to_dict(self.run.config),
                "options": to_dict(self.run.task.options), "metrics": metrics or {}}

    def _save(self, meta: dict[str, Any]) -> Path | None:
        """Write a checkpoint; its path on rank 0. Under FSDP every rank must call it."""
        run = self.run
        if run.checkpoint_root is None:
            return None
        if run.sharded_checkpoints:
            return dcp.save(run, run_state(run, self.state, self.window, self.history,
                                           self.last_eval, self.rng_snapshot, sharded=True,
                                           windows=self.window_snapshot), meta)
        if not run.dist.is_main:
            return None
        state = run_state(run, self.state, self.window, self.history, self.last_eval,
                          self.rng_snapshot, windows=self.window_snapshot)
        return ckpt.save_checkpoint(run.checkpoint_root, self.state.step, state, meta,
                                    run.config.keep_last_checkpoints,
                                    durable=run.config.checkpoint_fsync)


def _peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux: KiB
