"""EMA of parameters and buffers; evaluation on EMA weights; EMA in checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import ListReporter, TrainConfig, fit
from trainers.checkpoint import latest_checkpoint
from trainers.checkpoint_read import load_checkpoint
from trainers.ema import EMA

DECAY = 0.8


def test_ema_follows_parameters_and_batchnorm_buffers(tmp_path):
    task = RegressionTask(RegressionOptions(batch_norm=True))
    trajectory = []

    class Recorder(ListReporter):
        def report(self, metrics, save_checkpoint):
            trajectory.append(copy.deepcopy(task.model.state_dict()))
            return super().report(metrics, save_checkpoint)

    config = TrainConfig(micro_batch_size=8, max_updates=6, max_epochs=None, eval_interval=1,
                         ema_decay=DECAY, lr=0.05, seed=1, checkpoint_dir=str(tmp_path))
    torch.manual_seed(1)
    initial = copy.deepcopy(RegressionTask(RegressionOptions(batch_norm=True))
                            .build_model(config).state_dict())
    reporter = Recorder()
    result = fit(task, config, reporter)

    expected = {k: v.clone() for k, v in initial.items()}
    for state in trajectory:  # ema = decay * ema + (1 - decay) * current, after every update
        for k, v in state.items():
            if v.is_floating_point():
                expected[k] = DECAY * expected[k] + (1 - DECAY) * v
            else:
                expected[k] = v.clone()
    ema_state = result.ema_model.state_dict()
    assert set(ema_state) == set(expected)
    assert "1.running_mean" in ema_state and "1.running_var" in ema_state
    for k in expected:
        assert torch.allclose(ema_state[k].float(), expected[k].float(), atol=1e-6, rtol=0), k
    assert ema_state["1.num_batches_tracked"] == 6  # a counter is copied, not averaged
    # the EMA moved away from the live weights: it is not a copy
    assert not torch.allclose(ema_state["0.weight"], task.model.state_dict()["0.weight"])

    # evaluation used the EMA weights
    val = task.datasets(0)[1]
    x, y = val.tensors
    ema_loss = ((result.ema_model(x).squeeze(-1) - y) ** 2).mean().item()
    assert reporter.reports[-1]["val_loss"] == pytest.approx(ema_loss, abs=1e-6)

    # and the EMA state is in the checkpoint
    saved = load_checkpoint(latest_checkpoint(tmp_path))["ema"]
    assert saved["n_updates"] == 6
    for k, v in saved["module"].items():
        assert torch.equal(v, ema_state[k])


def test_eval_with_ema_off_evaluates_live_weights():
    task = RegressionTask()
    reporter = ListReporter()
    config = TrainConfig(micro_batch_size=8, max_updates=4, max_epochs=None, ema_decay=0.9,
                         eval_with_ema=False)
    fit(task, config, reporter)
    x, y = task.datasets(0)[1].tensors
    task.model.eval()
    live = ((task.model(x).squeeze(-1) - y) ** 2).mean().item()
    assert reporter.reports[-1]["val_loss"] == pytest.approx(live, abs=1e-6)


def test_ema_rejects_decay_outside_unit_interval():
    with pytest.raises(ValueError, match="decay"):
        EMA(torch.nn.Linear(2, 2), 1.0)


def test_load_state_dict_takes_the_shadow_weights_and_keeps_this_emas_decay():
    model = torch.nn.Linear(2, 2)
    saved = EMA(model, 0.9)
    with torch.no_grad():
        model.weight.add_(1.0)
    saved.update(model)
    ema = EMA(torch.nn.Linear(2, 2), 0.5)
    ema.load_state_dict(saved.state_dict())
    assert (ema.decay, ema.n_updates) == (0.5, 1)  # the decay is the config's
    assert torch.equal(ema.module.weight, saved.module.weight)
