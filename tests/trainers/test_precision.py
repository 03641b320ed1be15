"""Precision (fp32, bf16, fp16 + GradScaler), clipping of unscaled gradients, non-finite values."""

from __future__ import annotations

import copy
import pickle
import shutil

import pytest
import torch

from tests.trainers.toy_tasks import LinearOptions, LinearTask, RegressionTask, flat_params
from trainers import ListReporter, NonFiniteError, TrainConfig, fit
from trainers.checkpoint import latest_checkpoint, list_checkpoints
from trainers.checkpoint_read import load_checkpoint

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_every_precision_trains(precision, device):
    reporter = ListReporter()
    config = TrainConfig(micro_batch_size=8, max_epochs=6, lr=3e-2, precision=precision,
                         device=device, schedule="constant")
    fit(RegressionTask(), config, reporter)
    losses = [r["val_loss"] for r in reporter.reports]
    assert losses[-1] < 0.5 * losses[0]
    if precision == "fp16":  # the first updates may overflow at the initial scale of 2**16
        assert reporter.reports[-1]["skipped_updates"] < reporter.reports[-1]["step"]
        assert reporter.reports[0]["loss_scale"] <= 2.0**16
    else:
        assert all(r["skipped_updates"] == 0 for r in reporter.reports)
        assert all(r["loss_scale"] == 1.0 for r in reporter.reports)


@needs_cuda
def test_autocast_runs_in_half_precision_on_cuda():
    seen = {}

    class Probe(RegressionTask):
        def loss_sum(self, model, batch):
            _, x, _ = batch
            seen["dtype"] = model(x).dtype
            return super().loss_sum(model, batch)

    fit(Probe(), TrainConfig(max_updates=1, max_epochs=None, precision="bf16", device="cuda"))
    assert seen["dtype"] == torch.bfloat16


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clipping_sees_unscaled_gradient(precision):
    # gradient of every sample is c = (3, 4): true norm 5; clip to 1; SGD lr 1
    reporter = ListReporter()
    config = TrainConfig(micro_batch_size=5, max_updates=1, max_epochs=None, optimizer="sgd",
                         momentum=0.0, lr=1.0, schedule="constant", max_grad_norm=1.0,
                         precision=precision)
    result = fit(LinearTask(), config, reporter)
    assert reporter.reports[-1]["grad_norm"] == pytest.approx(5.0, abs=1e-5)
    update = result.model.p.detach()
    assert update.norm().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(update, -torch.tensor([0.6, 0.8]), atol=1e-6)


def _overflow_run(init_loss_scale: float, tmp_path):
    reporter = ListReporter()
    task = LinearTask(LinearOptions(n_samples=40, c1=30.0, c2=40.0))
    config = TrainConfig(micro_batch_size=2, grad_accum_steps=2, max_updates=1, max_epochs=None,
                         optimizer="sgd", momentum=0.0, lr=0.01, schedule="cosine",
                         warmup_steps=2, precision="fp16", init_loss_scale=init_loss_scale,
                         ema_decay=0.5, max_grad_norm=None, checkpoint_dir=str(tmp_path))
    result = fit(task, config, reporter)
    return result, reporter.reports[-1], load_checkpoint(latest_checkpoint(tmp_path))


def test_fp16_overflow_skips_update_and_changes_nothing_but_the_scale(tmp_path):
    # Each micro-batch's fp16 gradient of p is 2 samples * c * scale / 4 items, up to
    # 20 * scale: it overflows fp16 (max 65504) until the scale is 2**11. From 2**24 the
    # scaler skips 13 updates, halving its scale each time.
    # Every sample is the same, so once an update goes through, parameters, EMA and LR
    # schedule must equal those of a run that never overflowed.
    normal, normal_metrics, normal_ckpt = _overflow_run(2.0**10, tmp_path / "normal")
    skipped, skipped_metrics, skipped_ckpt = _overflow_run(2.0**24, tmp_path / "overflow")
    assert normal_metrics["skipped_updates"] == 0
    k = skipped_metrics["skipped_updates"]
    assert k == 13
    assert skipped_metrics["loss_scale"] == 2.0 ** (24 - k)  # backed off by 1/2 per skip
    assert skipped.n_updates == normal.n_updates == 1
    assert torch.equal(skipped.model.p, normal.model.p)
    assert torch.equal(skipped.ema_model.p, normal.ema_model.p)
    assert skipped_ckpt["scheduler"]["last_epoch"] == normal_ckpt["scheduler"]["last_epoch"] == 1
    assert skipped_metrics["lr"] == normal_metrics["lr"]
    assert skipped_ckpt["ema"]["n_updates"] == 1


class _PoisonedTask(LinearTask):
    """Loss (or gradient) becomes non-finite from the 3rd optimizer update on."""

    def __init__(self, what: str) -> None:
        super().__init__(LinearOptions(n_samples=100))
        self.what, self.calls, self.snapshots = what, 0, []

    def loss_sum(self, model, batch):
        self.calls += 1
        loss = super().loss_sum(model, batch)
        if self.calls >= 3:  # micro_batch = whole group: call k belongs to update k
            if self.what == "loss":
                return loss * float("nan")
            return loss + (model.p * torch.tensor([1e38, 1e38])).sum()  # finite loss, inf norm
        return loss


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("what", ["loss", "grad_norm"])
def test_non_finite_raises_naming_the_step_and_is_not_applied(what, precision):
    task = _PoisonedTask(what)

    class Snapshot(ListReporter):
        def report(self, metrics, save_checkpoint):
            task.snapshots.append(copy.deepcopy(task.model.p.detach()))
            return super().report(metrics, save_checkpoint)

    config = TrainConfig(micro_batch_size=4, max_updates=10, max_epochs=None, optimizer="sgd",
                         lr=1e-3, eval_interval=1, precision=precision, max_grad_norm=1.0)
    with pytest.raises(NonFiniteError) as info:
        fit(task, config, Snapshot())
    assert info.value.step == 3
    assert info.value.quantity == what
    assert "optimizer update 3" in str(info.value)
    assert len(task.snapshots) == 2
    assert torch.equal(task.model.p.detach(), task.snapshots[-1])  # update 3 never applied


def test_fp16_skips_non_finite_instead_of_raising():
    task = _PoisonedTask("loss")
    config = TrainConfig(micro_batch_size=4, max_updates=10, max_epochs=None, optimizer="sgd",
                         lr=1e-3, precision="fp16", init_loss_scale=1.0, max_grad_norm=1.0)
    with pytest.raises(NonFiniteError, match="optimizer update 3"):
        fit(task, config)  # every update from the 3rd is NaN: skipped, then given up
    assert flat_params(task.model).isfinite().all()


class _OverflowsOnSample(RegressionTask):
    """The toy regression whose fp16 gradient overflows in every group holding sample 5 or
    17: a skip the data decides, so a resumed run meets it where the uninterrupted one did."""

    def loss_sum(self, model, batch):
        loss = super().loss_sum(model, batch)
        idx = batch[0]
        if bool(((idx == 5) | (idx == 17)).any()):
            loss = loss + model[0].weight.sum() * float("inf")  # a gradient of inf
        return loss


def _skipping(root, **changes) -> TrainConfig:
    base = dict(micro_batch_size=4, grad_accum_steps=2, max_epochs=3, max_updates=None,
                precision="fp16", init_loss_scale=1.0, schedule="cosine", min_lr_ratio=0.1,
                lr=0.05, warmup_steps=2, eval_interval=1, checkpoint_interval=1,
                keep_last_checkpoints=100, checkpoint_dir=str(root), checkpoint_fsync=False,
                seed=3)
    return TrainConfig(**{**base, **changes})


def test_an_epoch_bound_fp16_run_decays_to_the_end_through_skipped_updates(tmp_path):
    """helper-38: the schedule spanned update groups but advanced on applied updates only,
    so a run bound by max_epochs ended before its decay (cosine to 0.1 ended at 0.378 of
    the peak after 6 skips of 20). Each skip now makes the span one update shorter."""
    reporter = ListReporter()
    result = fit(_OverflowsOnSample(), _skipping(tmp_path), reporter)
    last = reporter.reports[-1]
    groups = 3 * 64 // 8  # 3 epochs of 64 samples in groups of 2 x 4
    skipped = last["skipped_updates"]
    assert 3 <= skipped <= 6  # samples 5 and 17: in one group or two, in each of 3 epochs
    assert result.n_updates == groups - skipped == last["planned_updates"]
    assert last["lr"] == pytest.approx(0.05 * 0.1, rel=1e-12)
    lrs = [r["lr"] for r in reporter.reports]
    assert all(a >= b for a, b in zip(lrs[2:], lrs[3:], strict=False))  # never rises after warmup


def test_a_resume_after_skipped_updates_ends_bit_identical(tmp_path):
    full = ListReporter()
    uninterrupted = fit(_OverflowsOnSample(), _skipping(tmp_path / "full"), full)
    checkpoints = list_checkpoints(tmp_path / "full")
    assert len(checkpoints) > 10
    for step, path in checkpoints[1:-1:3]:
        copy = tmp_path / f"copy-{step}"
        copy.mkdir()
        shutil.copytree(path, copy / path.name)
        after = ListReporter()
        resumed = fit(_OverflowsOnSample(), _skipping(copy), after, resume_from=copy)
        assert [r["lr"] for r in after.reports] == [
            r["lr"] for r in full.reports if r["step"] > step], step
        assert after.reports[-1]["planned_updates"] == full.reports[-1]["planned_updates"]
        for a, b in zip(uninterrupted.model.state_dict().values(),
                        resumed.model.state_dict().values(), strict=True):
            assert torch.equal(a, b), step


def test_giving_up_after_skips_in_a_row_names_the_loss_scale():
    task = _PoisonedTask("loss")
    config = TrainConfig(micro_batch_size=4, max_updates=10, max_epochs=None, optimizer="sgd",
                         lr=1e-3, precision="fp16", init_loss_scale=1.0, max_grad_norm=1.0)
    with pytest.raises(NonFiniteError) as info:
        fit(task, config)
    message = str(info.value)
    assert "at optimizer update 3; fp16 skipped it for overflow 26 times in a row" in message
    assert f"the loss scale fell to {2.0 ** -26:g}" in message
    assert "lower init_loss_scale or lr" in message
    again = pickle.loads(pickle.dumps(info.value))  # Ray ships it between processes
    assert str(again) == message and again.loss_scale == info.value.loss_scale
