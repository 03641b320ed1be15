"""Checkpoints: complete contents, atomic writes, retention, bit-exact resume."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import Decision, ListReporter, TrainConfig, fit
from trainers.checkpoint import best_checkpoint, latest_checkpoint, list_checkpoints
from trainers.checkpoint_read import load_checkpoint
from trainers.errors import CheckpointError, ConfigError, NonFiniteError, UnknownTaskError
from trainers.schedules import lr_factor

REPO = Path(__file__).resolve().parents[2]
OPTIONS = RegressionOptions(n_samples=64, dropout=0.3, batch_norm=True)


def _config(tmp_path: Path, **kw) -> TrainConfig:
    base = dict(micro_batch_size=8, grad_accum_steps=2, max_updates=11, max_epochs=None,
                eval_interval=1, lr=0.05, weight_decay=0.01, warmup_steps=2, ema_decay=0.9,
                checkpoint_dir=str(tmp_path), keep_last_checkpoints=50, seed=7,
                early_stopping_patience=100)
    return TrainConfig(**{**base, **kw})


class StopAt(ListReporter):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def report(self, metrics, save_checkpoint):
        super().report(metrics, save_checkpoint)
        return Decision.STOP if metrics["step"] == self.step else Decision.CONTINUE


def _trajectory(reports):
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in reports]


@pytest.mark.parametrize("k", [4, 6], ids=["epoch-boundary", "mid-epoch"])
def test_resume_is_bit_identical_to_uninterrupted_run(k, tmp_path):
    # 64 samples / (8 x 2) = 4 updates per epoch: k=4 ends epoch 0, k=6 is mid-epoch 1.
    # Dropout and BatchNorm make the run depend on the RNG and buffer states.
    full_reporter = ListReporter()
    full = fit(RegressionTask(OPTIONS), _config(tmp_path / "full"), full_reporter)

    first = StopAt(k)
    fit(RegressionTask(OPTIONS), _config(tmp_path / "cut"), first)
    assert first.reports[-1]["step"] == k
    second = ListReporter()
    resumed = fit(RegressionTask(OPTIONS), _config(tmp_path / "cut"), second,
                  resume_from=tmp_path / "cut")
    assert second.reports[0]["step"] == k + 1
    assert _trajectory(first.reports + second.reports) == _trajectory(full_reporter.reports)
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)
    for a, b in zip(full.ema_model.state_dict().values(),
                    resumed.ema_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fsync", [True, False], ids=["durable", "no-fsync"])
def test_checkpoints_are_fsynced_unless_asked_not_to_and_resume_either_way(fsync, tmp_path,
                                                                          monkeypatch):
    calls = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
    first = StopAt(4)
    fit(RegressionTask(OPTIONS), _config(tmp_path, checkpoint_fsync=fsync), first)
    assert bool(calls) == fsync
    resumed = ListReporter()
    fit(RegressionTask(OPTIONS), _config(tmp_path, checkpoint_fsync=fsync), resumed,
        resume_from=tmp_path)
    assert resumed.reports[0]["step"] == 5


def test_checkpoint_holds_every_piece_of_state(tmp_path):
    fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=6, precision="fp16"))
    state = load_checkpoint(latest_checkpoint(tmp_path))
    for key in ["model", "optimizer", "scheduler", "scaler", "ema", "trainer", "rng", "config"]:
        assert state[key] is not None, key
    trainer = state["trainer"]
    groups = 6 + trainer["skipped_updates"]  # fp16 may skip early updates; they consume data
    assert (trainer["step"], trainer["epoch"], trainer["position"]) == (6, 1, 16 * groups - 64)
    assert {"best_value", "best_step", "evals_without_improvement", "skipped_updates"} <= set(
        trainer)
    assert set(state["rng"][0]) == {"python", "numpy", "torch", "cuda"}
    assert state["scaler"]["scale"] > 0
    assert state["scheduler"]["last_epoch"] == 6
    meta = json.loads((latest_checkpoint(tmp_path) / "meta.json").read_text())
    assert meta["step"] == 6 and meta["task"] == "toy-regression"


@pytest.mark.parametrize("values, kept, best", [
    ([5.0, 1.0, 4.0, 3.0, 2.5, 2.0], [2, 5, 6], 2),
    # a new best prunes the previous one (before, it stayed: the save of step 6 still
    # saw it marked best)
    ([5.0, 1.0, 4.0, 3.0, 2.5, 0.5], [5, 6], 6),
    ([5.0, 1.0, 4.0, 0.5, 2.5, 2.0], [4, 5, 6], 4),
], ids=["best-early", "best-last", "best-moves"])
def test_last_n_and_best_are_kept(tmp_path, values, kept, best):
    scripted = iter(values)

    class Scripted(RegressionTask):
        def eval_metrics(self, sums):
            return {"val_loss": next(scripted)}

    fit(Scripted(OPTIONS), _config(tmp_path, max_updates=6, keep_last_checkpoints=2))
    assert [step for step, _ in list_checkpoints(tmp_path)] == kept
    assert best_checkpoint(tmp_path).name == f"checkpoint-{best:08d}"
    assert json.loads((tmp_path / "best.json").read_text())["value"] == min(values)


KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys, torch
    from trainers import checkpoint
    from tests.trainers.toy_tasks import RegressionTask
    from trainers import TrainConfig, fit

    real_save = torch.save
    calls = {"n": 0}

    def dying_save(obj, f, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:  # third checkpoint: write half a file, then die
            f.write(b"PK\\x03\\x04 partial")
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return real_save(obj, f, *a, **kw)

    checkpoint.torch.save = dying_save
    config = TrainConfig(micro_batch_size=8, max_updates=10, max_epochs=None, eval_interval=1,
                         checkpoint_dir=sys.argv[1], keep_last_checkpoints=5)
    fit(RegressionTask(), config)
""")


def test_process_killed_while_writing_leaves_previous_checkpoint_loadable(tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(KILL_SCRIPT)
    root = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(root)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == -9
    assert [step for step, _ in list_checkpoints(root)] == [1, 2]
    leftovers = [p.name for p in root.iterdir() if p.name.startswith(".tmp-")]
    assert len(leftovers) == 1  # the half-written one, never renamed into place
    assert load_checkpoint(root)["trainer"]["step"] == 2
    # resuming works and the next save cleans the dead writer's leftovers
    fit(RegressionTask(), TrainConfig(micro_batch_size=8, max_updates=4, max_epochs=None,
                                      eval_interval=1, checkpoint_dir=str(root)),
        resume_from=root)
    assert [step for step, _ in list_checkpoints(root)][-1] == 4
    assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]


def test_resume_from_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        fit(RegressionTask(), TrainConfig(max_updates=1, max_epochs=None), resume_from=tmp_path)


def test_resume_into_a_different_model_is_a_clear_error(tmp_path):
    fit(RegressionTask(), _config(tmp_path, max_updates=1))
    with pytest.raises(ConfigError, match="made with hidden=8, this run has 3"):
        fit(RegressionTask(RegressionOptions(hidden=3)), _config(tmp_path, max_updates=2),
            resume_from=tmp_path)


def test_a_checkpoint_that_does_not_fit_the_model_built_is_a_clear_error(tmp_path):
    fit(RegressionTask(), _config(tmp_path, max_updates=1))

    class Wider(RegressionTask):  # another model under the same options (changed task code)
        def build_model(self, config):
            return super().build_model(config).append(torch.nn.Linear(1, 1))

    with pytest.raises(CheckpointError, match="does not fit this run") as info:
        fit(Wider(), _config(tmp_path, max_updates=2), resume_from=tmp_path)
    # one line, with the keys (helper-41: a trial's one-line fail_reason ended at torch's
    # "Error(s) in loading state_dict for Sequential:", its keys on the lines cut off)
    message = str(info.value)
    assert "\n" not in message and "the task's code" in message
    assert 'Missing key(s) in state_dict: "4.weight", "4.bias".' in message


def test_resume_with_changed_lr_takes_the_new_lr_at_the_same_schedule_position(tmp_path):
    reporter = StopAt(3)
    fit(RegressionTask(), _config(tmp_path, max_updates=8, schedule="constant"), reporter)
    assert reporter.reports[-1]["lr"] == pytest.approx(0.05)
    after = ListReporter()
    fit(RegressionTask(), _config(tmp_path, max_updates=8, schedule="constant", lr=0.01), after,
        resume_from=tmp_path)
    assert after.reports[0]["step"] == 4
    assert after.reports[0]["lr"] == pytest.approx(0.01)


def test_resume_with_another_optimizer_is_a_clear_error(tmp_path):
    fit(RegressionTask(), _config(tmp_path, max_updates=2))
    with pytest.raises(CheckpointError, match="adamw optimizer state.*optimizer=sgd"):
        fit(RegressionTask(), _config(tmp_path, max_updates=4, optimizer="sgd"),
            resume_from=tmp_path)


def test_ema_switched_on_at_resume_starts_from_the_loaded_weights(tmp_path):
    first = fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=4, ema_decay=None))
    resumed = fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=4, ema_decay=0.9),
                  resume_from=tmp_path)  # no update left: the EMA is the loaded model
    for a, b in zip(first.model.state_dict().values(),
                    resumed.ema_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_train_loss_window_survives_a_mid_window_checkpoint(tmp_path):
    # evaluations every 4 updates, checkpoints every 3: resuming from update 3 must still
    # report the mean over updates 1-4 at update 4
    cfg = dict(eval_interval=4, checkpoint_interval=3, max_updates=8)
    full = ListReporter()
    fit(RegressionTask(OPTIONS), _config(tmp_path / "full", **cfg), full)

    checkpoint_3 = tmp_path / "full" / "checkpoint-00000003"
    resumed = ListReporter()
    fit(RegressionTask(OPTIONS), _config(tmp_path / "again", **cfg), resumed,
        resume_from=checkpoint_3)
    assert resumed.reports[0]["step"] == 4
    assert resumed.reports[0]["train_loss"] == pytest.approx(full.reports[0]["train_loss"],
                                                             rel=1e-6)


def test_bad_best_json_and_dead_writers_leftovers_do_not_break_saving(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "best.json").write_text("garbage")
    (tmp_path / ".best.json.999999.tmp").write_text("{}")  # a writer that died
    fit(RegressionTask(), _config(tmp_path, max_updates=3))
    assert best_checkpoint(tmp_path) is not None
    assert not (tmp_path / ".best.json.999999.tmp").exists()


def test_unwritable_checkpoint_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ConfigError) as info:
        fit(RegressionTask(), _config(blocker / "sub", max_updates=3))
    assert info.value.field == "checkpoint_dir"


def test_errors_survive_pickling():
    # Ray ships a trial's exception to the driver by pickling it
    for error in [ConfigError("lr", "must be > 0"), NonFiniteError(3, "loss", float("nan")),
                  UnknownTaskError("x", ["digits"]), CheckpointError("gone")]:
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)


# -- issue 11.7: the checkpoint gives the state, the config every hyperparameter ----------


def test_resume_with_another_ema_decay_averages_with_the_new_one(tmp_path):
    fit(RegressionTask(OPTIONS), _config(tmp_path, ema_decay=0.9), StopAt(4))
    # decay 0 folds in the live weights entirely: the EMA must end equal to the model
    resumed = fit(RegressionTask(OPTIONS), _config(tmp_path, ema_decay=0.0),
                  resume_from=tmp_path / "checkpoint-00000004")
    assert resumed.n_updates == 11
    for a, b in zip(resumed.model.state_dict().values(),
                    resumed.ema_model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    assert load_checkpoint(latest_checkpoint(tmp_path))["ema"]["decay"] == 0.0


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_resume_takes_every_optimizer_hyperparameter_from_the_config(optimizer, tmp_path):
    before = dict(optimizer=optimizer, lr=0.05, weight_decay=0.01, adam_beta1=0.9,
                  adam_beta2=0.999, momentum=0.9, schedule="constant", warmup_steps=0)
    fit(RegressionTask(OPTIONS), _config(tmp_path, **before), StopAt(4))
    after = {**before, "lr": 0.02, "weight_decay": 0.3, "adam_beta1": 0.5, "adam_beta2": 0.75,
             "momentum": 0.25}
    fit(RegressionTask(OPTIONS), _config(tmp_path, **after),
        resume_from=tmp_path / "checkpoint-00000004")
    groups = load_checkpoint(latest_checkpoint(tmp_path))["optimizer"]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.3, 0.0]  # never on biases and norms
    for g in groups:
        assert (g["lr"], g["initial_lr"]) == (0.02, 0.02)
        if optimizer == "sgd":
            assert g["momentum"] == 0.25
        else:
            assert tuple(g["betas"]) == (0.5, 0.75)


def test_resume_follows_the_configs_schedule_from_the_saved_position(tmp_path):
    fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=8, schedule="cosine"), StopAt(4))
    new = dict(max_updates=12, lr=0.02, schedule="linear", warmup_steps=3, min_lr_ratio=0.1)
    reporter = ListReporter()
    fit(RegressionTask(OPTIONS), _config(tmp_path, **new), reporter,
        resume_from=tmp_path / "checkpoint-00000004")
    assert [r["step"] for r in reporter.reports] == list(range(5, 13))
    for r in reporter.reports:  # the LR after `step` updates of the new schedule
        expected = 0.02 * lr_factor(r["step"], schedule="linear", total_steps=12,
                                    warmup_steps=3, min_lr_ratio=0.1)
        assert (r["lr"], r["planned_updates"]) == (pytest.approx(expected, abs=1e-15), 12)


class OnRequest(ListReporter):
    """Asks for a checkpoint at the given steps only, and says the loop should write none
    of its own (``checkpoints_on_request``)."""

    checkpoints_on_request = True

    def __init__(self, steps: set[int]) -> None:
        super().__init__()
        self.steps, self.saved = steps, []

    def report(self, metrics, save_checkpoint):
        if metrics["step"] in self.steps:
            self.saved.append(save_checkpoint())
        return super().report(metrics, save_checkpoint)


@pytest.mark.parametrize("checkpoint_interval", [None, 2], ids=["every-eval", "interval-2"])
def test_a_reporter_that_checkpoints_on_request_gets_only_what_it_asks(tmp_path,
                                                                       checkpoint_interval):
    # hpo's Tune reporter decides which reports carry a checkpoint: the loop writes
    # neither its per-evaluation, its best, nor its interval checkpoints then
    config = _config(tmp_path, eval_interval=2, checkpoint_interval=checkpoint_interval)
    reporter = OnRequest({4, 10})
    fit(RegressionTask(OPTIONS), config, reporter)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 10]
    assert reporter.saved == [path for _, path in list_checkpoints(tmp_path)]
    assert best_checkpoint(tmp_path) is None  # no best marked: no eager checkpoint
    # the checkpoint asked at step 4 resumes bit for bit like any other
    resumed = ListReporter()
    fit(RegressionTask(OPTIONS), config, resumed, resume_from=reporter.saved[0])
    assert resumed.reports[0]["step"] == 6
    assert _trajectory(reporter.reports[:2] + resumed.reports) == _trajectory(reporter.reports)


def test_a_plain_reporter_still_gets_a_checkpoint_at_every_evaluation(tmp_path):
    fit(RegressionTask(OPTIONS), _config(tmp_path, eval_interval=2), ListReporter())
    assert [step for step, _ in list_checkpoints(tmp_path)] == [2, 4, 6, 8, 10, 11]


@pytest.mark.parametrize(("where", "failing_call"), [("state", 2), ("meta", 3), ("rename", 2)])
def test_a_full_disk_while_writing_a_checkpoint_is_a_checkpoint_error_and_keeps_the_earlier(
        where, failing_call, tmp_path, monkeypatch):
    from trainers import checkpoint
    from trainers.errors import CheckpointWriteError

    full = OSError(28, "No space left on device")
    calls = {"n": 0}

    def failing_on_the_second(real):
        def wrapper(*a, **kw):
            calls["n"] += 1
            if calls["n"] == failing_call:
                raise full
            return real(*a, **kw)
        return wrapper

    if where == "state":
        monkeypatch.setattr(checkpoint.torch, "save", failing_on_the_second(torch.save))
    elif where == "meta":
        monkeypatch.setattr(checkpoint, "write_atomically",
                            failing_on_the_second(checkpoint.write_atomically))
    else:
        monkeypatch.setattr(checkpoint.os, "rename", failing_on_the_second(os.rename))
    config = TrainConfig(micro_batch_size=8, max_updates=3, max_epochs=None, eval_interval=1,
                         checkpoint_dir=str(tmp_path), checkpoint_fsync=False)
    with pytest.raises(CheckpointWriteError) as e:
        fit(RegressionTask(), config)
    monkeypatch.undo()
    assert str(e.value) == (f"cannot write checkpoint {tmp_path / 'checkpoint-00000002'}: "
                            "OSError: [Errno 28] No space left on device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "checkpoint-00000001"]
    assert load_checkpoint(tmp_path)["trainer"]["step"] == 1


REPLACE_KILL_SCRIPT = textwrap.dedent("""
    import os, shutil, signal, sys
    from pathlib import Path
    from trainers import checkpoint

    root, point = Path(sys.argv[1]), sys.argv[2]
    real_rename, real_rmtree = os.rename, shutil.rmtree

    def rename(src, dst):  # "between": tmp is about to replace final, already renamed away
        if point == "between" and Path(src).name.startswith(".tmp-") and Path(dst).name == \\
                "checkpoint-00000003" and any(p.name.startswith(".trash-") for p in root.iterdir()):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(src, dst)

    def rmtree(path, *a, **kw):  # "after": both renames done, the replaced one not removed
        if point == "after" and Path(path).name.startswith(".trash-"):
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rmtree(path, *a, **kw)

    checkpoint.os.rename, checkpoint.shutil.rmtree = rename, rmtree
    run = {"task": "t", "config": {"lr": 0.1}, "options": {}}  # one run: a replacement
    for version, step in [("old", 2), ("old", 3), ("new", 3)]:
        checkpoint.save_checkpoint(root, step, {"version": version, "step": step},
                                   {"step": step, **run}, keep_last=1)
""")


@pytest.mark.slow  # two interpreters importing torch
@pytest.mark.parametrize("point", ["between", "after"])
def test_a_kill_while_a_checkpoint_of_the_same_step_is_replaced_leaves_the_new_one_loadable(
        point, tmp_path):
    script = tmp_path / "kill.py"
    script.write_text(REPLACE_KILL_SCRIPT)
    root = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(root), point], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert proc.returncode == -9
    left = sorted(p.name.split("-")[0] + "-" + p.name.split("-")[1] for p in root.iterdir())
    assert left == ([".tmp-checkpoint", ".trash-checkpoint"] if point == "between"
                    else [".trash-checkpoint", "checkpoint-00000003"])
    # what resume reads: the new version, put in place
    assert load_checkpoint(root) == {"version": "new", "step": 3}
    assert [step for step, _ in list_checkpoints(root)] == [3]
    # the next save clears the leftovers of the dead writer
    from trainers.checkpoint import save_checkpoint
    save_checkpoint(root, 4, {"step": 4}, {"step": 4}, keep_last=2, durable=False)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-00000003",
                                                      "checkpoint-00000004"]


def test_resuming_an_older_checkpoint_into_the_same_root_retires_the_later_ones(tmp_path):
    """A run only goes forward: checkpoints of later steps under the root it writes into are
    another trajectory's. Left there, retention pruned the resumed run's own and a resume of
    the root continued the abandoned trajectory; they are renamed aside, kept whole."""
    config = TrainConfig(micro_batch_size=8, max_updates=12, max_epochs=None, eval_interval=2,
                         lr=0.05, checkpoint_dir=str(tmp_path), keep_last_checkpoints=50,
                         checkpoint_fsync=False)
    fit(RegressionTask(), config)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 4, 6, 8, 10, 12]
    first_12 = load_checkpoint(tmp_path / "checkpoint-00000012")
    fit(RegressionTask(), config.replace(max_updates=9, lr=0.001, keep_last_checkpoints=2),
        resume_from=tmp_path / "checkpoint-00000004")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [8, 9]
    assert load_checkpoint(tmp_path)["config"]["lr"] == 0.001  # the root's newest: this run
    retired = sorted(p.name[:len("retired-checkpoint-00000000")] for p in tmp_path.iterdir()
                     if p.name.startswith("retired-"))
    assert retired == ["retired-checkpoint-00000006", "retired-checkpoint-00000008",
                       "retired-checkpoint-00000010", "retired-checkpoint-00000012"]
    [path_12] = tmp_path.glob("retired-checkpoint-00000012-*")
    kept = load_checkpoint(path_12)
    assert kept["trainer"] == first_12["trainer"] and kept["config"]["lr"] == 0.05
    assert all(torch.equal(kept["model"][k], v) for k, v in first_12["model"].items())


def test_an_interval_checkpoint_then_its_evaluation_replace_not_retire(tmp_path):
    """checkpoint_interval 1 and end-of-epoch evaluations: the last update of an epoch is
    checkpointed (kept so that an evaluation that fails is resumed without training
    again), then evaluated (a new epoch, position 0) and checkpointed again."""
    fit(RegressionTask(), TrainConfig(micro_batch_size=8, max_epochs=2, checkpoint_interval=1,
                                      checkpoint_dir=str(tmp_path), keep_last_checkpoints=1,
                                      checkpoint_fsync=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "checkpoint-00000016"]
    state = load_checkpoint(tmp_path / "checkpoint-00000016")  # the evaluation's version
    assert (state["trainer"]["epoch"], state["trainer"]["position"]) == (2, 0)
    assert state["last_eval"] == [16, 128] and len(state["history"]) == 2


def test_a_step_written_twice_by_the_same_run_is_replaced_not_retired(tmp_path):
    """A run resumed from its last checkpoint with nothing left to train reports its last
    evaluation again, and a reporter that asks for that report's checkpoint gets the
    same step written again: it replaces the first, it is not retired."""
    class Saving:
        def report(self, metrics, save_checkpoint):
            self.path = save_checkpoint()
            return Decision.CONTINUE

    config = TrainConfig(micro_batch_size=8, max_epochs=2, checkpoint_interval=1,
                         checkpoint_dir=str(tmp_path), keep_last_checkpoints=1,
                         checkpoint_fsync=False)
    fit(RegressionTask(), config)
    first = load_checkpoint(tmp_path / "checkpoint-00000016")
    reporter = Saving()
    fit(RegressionTask(), config, reporter, resume_from=tmp_path)
    assert reporter.path == tmp_path / "checkpoint-00000016"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.json", "checkpoint-00000016"]
    state = load_checkpoint(tmp_path / "checkpoint-00000016")
    assert (state["trainer"]["epoch"], state["trainer"]["position"]) == (2, 0)
    assert state["last_eval"] == [16, 128] and state["history"] == first["history"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_a_lone_temporary_checkpoint_is_never_put_back_in_place(tmp_path):
    """A breaker: a ``.tmp-`` that a writer left before its only rename (never published)
    was put back by the listing inside the save that had just retired that step, and then
    counted by retention: the resumed run's own checkpoint was pruned and the abandoned
    trajectory became the root's newest again. Only a ``.tmp-`` beside its ``.trash-``
    twin (a replace cut between its renames) is put back."""
    config = TrainConfig(micro_batch_size=8, max_updates=6, max_epochs=None, eval_interval=2,
                         checkpoint_dir=str(tmp_path), keep_last_checkpoints=10,
                         checkpoint_fsync=False)
    fit(RegressionTask(), config)
    stray = tmp_path / f".tmp-checkpoint-00000006-{_dead_pid()}-deadbeef"
    os.system(f"cp -r {tmp_path / 'checkpoint-00000006'} {stray}")
    fit(RegressionTask(), config.replace(max_updates=5, eval_interval=1, lr=0.01,
                                         keep_last_checkpoints=1),
        resume_from=tmp_path / "checkpoint-00000004")
    steps = [s for s, _ in list_checkpoints(tmp_path)]
    assert steps[-1] == 5 and 6 not in steps
    assert load_checkpoint(tmp_path)["config"]["lr"] == 0.01
    assert not stray.exists()


def test_a_full_disk_inside_torch_save_is_a_checkpoint_write_error(tmp_path, monkeypatch):
    """A breaker: ``torch.save`` failing mid-write raises its zip writer's RuntimeError
    ("unexpected pos") during the OSError, which passed as a traceback; any other
    RuntimeError is not the file system's and goes through as it is."""
    from trainers import checkpoint
    from trainers.errors import CheckpointWriteError

    def full_disk(*a, **kw):
        try:
            raise OSError(28, "No space left on device")
        except OSError:
            raise RuntimeError(  # noqa: B904 - as torch raises it: the OSError its context
                "[enforce fail at inline_container.cc:672] unexpected pos")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(CheckpointWriteError, match=r"checkpoint-00000001: OSError: \[Errno "
                                                   r"28\] No space left on device$"):
        checkpoint.save_checkpoint(tmp_path, 1, {}, {"step": 1}, keep_last=1, durable=False)
    assert list(tmp_path.iterdir()) == []  # the temporary directory went too

    def bug(*a, **kw):
        raise RuntimeError("not the disk")

    monkeypatch.setattr(checkpoint.torch, "save", bug)
    with pytest.raises(RuntimeError, match="^not the disk$"):
        checkpoint.save_checkpoint(tmp_path, 1, {}, {"step": 1}, keep_last=1, durable=False)


@pytest.mark.parametrize("change, retired", [
    ({"checkpoint_dir": "ckpt/../ckpt"}, False), ({"num_workers": 2}, False),
    ({"keep_last_checkpoints": 5, "device": "cpu", "eval_batch_size": 4}, False),
    ({"lr": 0.5}, True), ({"seed": 1}, True)])
def test_a_step_written_again_with_only_its_places_changed_is_the_same_run(
        tmp_path, change, retired):
    """A breaker: resuming with the directory spelt another way (or ``--num-workers 1``)
    retired the run's own checkpoint of the step it wrote again, and kept it forever."""
    from trainers.checkpoint import save_checkpoint

    run = {"task": "t", "options": {}}
    config = {"lr": 0.1, "seed": 0, "checkpoint_dir": "ckpt", "num_workers": 0}
    save_checkpoint(tmp_path, 3, {"v": 1}, {"step": 3, **run, "config": config}, keep_last=2,
                    durable=False)
    save_checkpoint(tmp_path, 3, {"v": 2}, {"step": 3, **run, "config": {**config, **change}},
                    keep_last=2, durable=False)
    assert load_checkpoint(tmp_path) == {"v": 2}
    assert any(p.name.startswith("retired-") for p in tmp_path.iterdir()) is retired



def _scripted(values) -> RegressionTask:
    """toy-regression whose evaluations report ``values`` as val_loss, in order."""
    left = iter(values)

    class Scripted(RegressionTask):
        def eval_metrics(self, sums):
            return {"val_loss": next(left)}

    return Scripted(OPTIONS)

class _Killed(BaseException):
    """A SIGKILL stand-in: nothing in the loop catches it."""


@pytest.mark.parametrize("values, killed_at, kept, best", [
    ([1.0, 4.0, 3.0, 2.5, 2.0, 1.5], 1, [1, 5, 6], 1),  # no best.json yet
    ([5.0, 1.0, 4.0, 3.0, 2.5, 2.0], 2, [2, 5, 6], 2),  # best.json names the older best
    ([5.0, 1.0, 4.0, 3.0, 2.5, 0.5], 6, [5, 6], 6),     # the last step's new best
], ids=["first-best", "a-new-best", "the-last-best"])
def test_a_kill_between_a_new_best_checkpoint_and_best_json_keeps_the_best_on_resume(
        tmp_path, monkeypatch, values, killed_at, kept, best):
    """Before, the resumed run's summary said best at step 2 while best.json named step 1
    (or nothing), and retention pruned checkpoint 2 (helper-25's finding)."""
    from trainers import checkpoint

    def scripted(start: int):
        return _scripted(values[start:])

    config = dict(max_updates=6, keep_last_checkpoints=2)
    whole = tmp_path / "whole"
    fit(scripted(0), _config(whole, **config))
    real = checkpoint.mark_best

    def killed(root, step, *args, **kwargs):
        if step == killed_at:
            raise _Killed
        return real(root, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "mark_best", killed)
    killed_dir = tmp_path / "killed"
    with pytest.raises(_Killed):
        fit(scripted(0), _config(killed_dir, **config))
    monkeypatch.setattr(checkpoint, "mark_best", real)
    result = fit(scripted(killed_at), _config(killed_dir, **config), resume_from=killed_dir)
    assert result.best_step == best
    for root in (whole, killed_dir):
        assert [step for step, _ in list_checkpoints(root)] == kept, root
        assert best_checkpoint(root).name == f"checkpoint-{best:08d}"
        assert json.loads((root / "best.json").read_text())["value"] == min(values)


def test_resuming_an_older_checkpoint_keeps_its_best_when_best_json_named_a_later_one(
        tmp_path):
    """The same rule on another path: the abandoned trajectory's best.json named its own
    later best (step 12, retired by the resumed run's first write), so no checkpoint was
    marked and retention pruned the resumed run's best (step 4)."""
    config = _config(tmp_path, max_updates=12, eval_interval=2)
    fit(_scripted([5.0, 1.0, 4.0, 3.0, 2.0, 0.5]), config)
    assert best_checkpoint(tmp_path).name == "checkpoint-00000012"
    result = fit(_scripted([3.0, 2.0]), config.replace(max_updates=8, lr=0.01,
                                                      keep_last_checkpoints=1),
                 resume_from=tmp_path / "checkpoint-00000004")
    assert (result.best_step, result.best_value) == (4, 1.0)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [4, 8]
    assert best_checkpoint(tmp_path).name == "checkpoint-00000004"
    retired = sorted(p.name[:len("retired-checkpoint-00000000")] for p in tmp_path.iterdir()
                     if p.name.startswith("retired-"))
    assert retired == ["retired-checkpoint-00000006", "retired-checkpoint-00000008",
                       "retired-checkpoint-00000010", "retired-checkpoint-00000012"]


def test_a_run_resumed_into_another_runs_directory_never_marks_that_runs_checkpoint(
        tmp_path):
    """The breaker: resumed from A's checkpoint into B's directory (``checkpoint_dir`` is a
    place, a resume may give it anew), the run's best step 2 named B's checkpoint 2 in
    B/best.json, with A's value: another run's weights, kept as this run's best."""
    a, b = tmp_path / "a", tmp_path / "b"
    fit(_scripted([5.0, 1.0, 4.0, 3.0]), _config(a, max_updates=4))
    fit(_scripted([6.0, 7.0, 2.0, 8.0, 9.0, 9.5]), _config(b, max_updates=6, lr=0.01))
    before = json.loads((b / "best.json").read_text())
    assert before["step"] == 3
    result = fit(_scripted([3.5, 3.2]), _config(b, max_updates=6),
                 resume_from=a / "checkpoint-00000004")
    assert (result.best_step, result.best_value) == (2, 1.0)
    assert json.loads((b / "best.json").read_text()) == before  # not B's step 2


@pytest.mark.parametrize(("stop_at", "sizes", "planned"), [
    # 64 samples, 4 updates an epoch (8 x 2), 4 epochs: 16 updates uninterrupted
    (3, dict(micro_batch_size=16, grad_accum_steps=2), 10),  # 3 + 1 (this epoch) + 3 x 2
    (4, dict(micro_batch_size=16, grad_accum_steps=2), 10),  # at an epoch's end: 4 + 3 x 2
    (3, dict(micro_batch_size=8, grad_accum_steps=1), 29),   # 3 + 2 + 3 x 8
    (4, dict(micro_batch_size=8, grad_accum_steps=1), 28),   # 4 + 3 x 8
    (3, dict(micro_batch_size=4, grad_accum_steps=4), 16),   # other sizes, as many updates
], ids=["bigger-batches-mid-epoch", "bigger-batches-epoch-end", "no-accumulation-mid-epoch",
        "no-accumulation-epoch-end", "same-updates"])
def test_a_resume_with_other_batch_sizes_spans_the_schedule_over_what_is_left(
        tmp_path, stop_at, sizes, planned):
    """helper-32: resumed with another micro-batch size or accumulation (PBT's exploit of
    micro_batch_size), the schedule was counted from zero under the new sizes while the
    step went on: 2 x 4 epochs = 8 planned updates at step 10, and an LR of 0 from there.
    Now it spans the updates made and those left; every update has an LR above 0."""
    config = dict(max_updates=None, max_epochs=4, schedule="cosine", min_lr_ratio=0.0)
    fit(RegressionTask(OPTIONS), _config(tmp_path, **config), StopAt(stop_at))
    after = ListReporter()
    result = fit(RegressionTask(OPTIONS), _config(tmp_path, **config, **sizes), after,
                 resume_from=tmp_path)
    assert result.n_updates == planned
    assert {r["planned_updates"] for r in after.reports} == {planned}
    # the LR of the next update (the last report's is the schedule's end: 0)
    assert all(r["lr"] > 0 for r in after.reports if r["step"] < planned)
    assert after.reports[-1]["step"] == planned and result.stop_reason == "max_epochs"


@pytest.mark.parametrize("sizes", [dict(micro_batch_size=16, grad_accum_steps=2),
                                   dict(micro_batch_size=8, grad_accum_steps=1)])
def test_every_later_resume_keeps_the_span_of_a_resume_that_changed_the_sizes(
        tmp_path, sizes):
    """helper-34: the span was corrected only on the resume that changed the sizes; the
    next resume, at the same new sizes, counted from zero again and the LR was 0 past it.
    Stopped at 3 (old sizes), then at 6 (new sizes), then run to the end: the span and the
    updates are those of one resume at 3."""
    config = dict(max_updates=None, max_epochs=4, schedule="cosine", min_lr_ratio=0.0)
    fit(RegressionTask(OPTIONS), _config(tmp_path / "once", **config), StopAt(3))
    once = fit(RegressionTask(OPTIONS), _config(tmp_path / "once", **config, **sizes),
               ListReporter(), resume_from=tmp_path / "once")
    fit(RegressionTask(OPTIONS), _config(tmp_path / "twice", **config), StopAt(3))
    fit(RegressionTask(OPTIONS), _config(tmp_path / "twice", **config, **sizes), StopAt(6),
        resume_from=tmp_path / "twice")
    after = ListReporter()
    twice = fit(RegressionTask(OPTIONS), _config(tmp_path / "twice", **config, **sizes),
                after, resume_from=tmp_path / "twice")
    assert after.reports[0]["step"] == 7
    assert {r["planned_updates"] for r in after.reports} == {once.n_updates}
    assert twice.n_updates == once.n_updates
    by_step = {r["step"]: r["lr"] for r in once.history}
    assert [r["lr"] for r in after.reports] == [by_step[r["step"]] for r in after.reports]


@pytest.mark.parametrize("torn", [1, 2], ids=["newest", "two-newest"])
def test_a_root_resumes_from_the_newest_checkpoint_that_loads(tmp_path, torn, caplog):
    """helper-38: a ``state.pt`` torn by a power loss (no fsync) made a resume of the root
    fail, though older checkpoints were whole."""
    full = fit(RegressionTask(OPTIONS), _config(tmp_path / "full", max_updates=8))
    root = tmp_path / "cut"
    fit(RegressionTask(OPTIONS), _config(root, max_updates=8, checkpoint_fsync=False),
        StopAt(6))
    found = list_checkpoints(root)
    for _, path in found[-torn:]:
        with open(path / "state.pt", "r+b") as f:
            f.truncate(100)
    resumed_at = found[-torn - 1][0]
    with caplog.at_level("WARNING", logger="trainers.checkpoint"):
        after = ListReporter()
        resumed = fit(RegressionTask(OPTIONS), _config(root, max_updates=8), after,
                      resume_from=root)
    assert after.reports[0]["step"] == resumed_at + 1
    assert [r.getMessage().split(":")[0] for r in caplog.records][:torn] == [
        f"skipping checkpoint {path.name}" for _, path in reversed(found[-torn:])]
    for a, b in zip(full.model.state_dict().values(), resumed.model.state_dict().values(),
                    strict=True):
        assert torch.equal(a, b)
    for _, path in list_checkpoints(root):  # the torn ones replaced or retired: all load
        torch.load(path / "state.pt", weights_only=True)


def test_a_root_whose_checkpoints_are_all_torn_fails_naming_the_newest(tmp_path):
    fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=3, checkpoint_fsync=False))
    found = list_checkpoints(tmp_path)
    for _, path in found:
        (path / "state.pt").write_bytes(b"torn")
    with pytest.raises(CheckpointError, match=f"cannot read checkpoint .*{found[-1][1].name}.*"
                                              "no older checkpoint under .* loads either"):
        fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=5), resume_from=tmp_path)
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):  # one named: no other
        fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=5),
            resume_from=found[-1][1])


def test_a_read_error_is_no_tear(tmp_path, monkeypatch):
    """helper-40: any failure counted as a tear, so one transient EIO rolled a run back,
    (its other finding, DDP ranks that fell back on their own: test_ddp_resume.py)."""
    fit(RegressionTask(OPTIONS), _config(tmp_path, max_updates=3, checkpoint_fsync=False))
    newest = list_checkpoints(tmp_path)[-1][1]
    real_load = torch.load

    def eio(path, *args, **kwargs):
        if Path(path).parent == newest:
            raise OSError(5, "Input/output error")
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(torch, "load", eio)
    with pytest.raises(CheckpointError, match="OSError"):
        load_checkpoint(tmp_path)
    monkeypatch.setattr(torch, "load", real_load)
    (newest / "state.pt").write_bytes(b"torn")
    assert load_checkpoint(tmp_path)["trainer"]["step"] < 3  # one process: falls back
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        load_checkpoint(tmp_path, fall_back=False)


def test_the_cli_resumes_a_root_whose_newest_metadata_is_torn(tmp_path):
    from tests.trainers.cli_in_process import run_main

    root = tmp_path / "ckpt"
    assert run_main("digits", "--width", "4", "--max-updates", "4", "--max-epochs", "none",
                    "--eval-interval", "2", "--no-checkpoint-fsync", "--checkpoint-dir",
                    str(root), "--quiet").returncode == 0
    newest = list_checkpoints(root)[-1][1]
    (newest / "meta.json").write_text("")
    (newest / "state.pt").write_bytes(b"torn")
    proc = run_main("--resume", str(root), "--max-updates", "6", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert (root / "checkpoint-00000006").is_dir()
