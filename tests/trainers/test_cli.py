"""``python -m trainers``: help, errors that name the option, training, resume."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.trainers.cli_in_process import run_main
from trainers.config import TrainConfig
from trainers.fields import describe

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainers", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def test_help_documents_every_option():
    proc = _cli("digits", "--help")
    assert proc.returncode == 0
    for info in describe(TrainConfig):
        assert "--" + info.name.replace("_", "-") in proc.stdout, info.name
    for option in ["--width", "--depth", "--dropout", "--resume"]:
        assert option in proc.stdout


def test_bad_options_exit_nonzero_naming_the_option():
    cases = {("digits", "--lr", "-1"): "--lr", ("digits", "--lr", "fast"): "--lr",
             ("digits", "--precision", "fp8"): "--precision", ("digits", "--bogus", "1"): "--bogus",
             ("digitz",): "digitz", ("digits", "--width", "0"): "--width",
             # past what AdamW's float32 step can hold: a traceback from inside it (helper-38)
             ("digits", "--lr", "1e308"): "--lr: must be in (0, 1e6]",
             ("digits", "--weight-decay", "1e300"): "--weight-decay: must be <= 1e6"}
    for args, name in cases.items():
        proc = run_main(*args)
        assert proc.returncode == 2, args
        assert name in proc.stderr, (args, proc.stderr)


@pytest.mark.slow  # 16 s here (2 idle cores)
def test_train_then_resume(tmp_path):
    ckpt = tmp_path / "ckpt"
    summary = tmp_path / "summary.json"
    proc = _cli("digits", "--max-epochs", "2", "--checkpoint-dir", str(ckpt),
                "--summary-json", str(summary))
    assert proc.returncode == 0, proc.stderr
    assert "step" in proc.stdout and "val_accuracy" in proc.stdout
    first = json.loads(summary.read_text())
    assert first["n_updates"] == 46 and first["stop_reason"] == "max_epochs"
    proc = _cli("--resume", str(ckpt), "--max-epochs", "3", "--summary-json", str(summary))
    assert proc.returncode == 0, proc.stderr
    second = json.loads(summary.read_text())
    assert second["n_updates"] == 69
    assert [line.split("|")[0].strip() for line in proc.stdout.splitlines() if "|" in line] == [
        "step     69"]


@pytest.mark.slow  # 11 s here (2 idle cores)
def test_resuming_a_copy_writes_into_the_copy_only(tmp_path):
    original, copy = tmp_path / "orig", tmp_path / "copy"
    assert _cli("digits", "--max-updates", "10", "--max-epochs", "none", "--eval-interval", "5",
                "--checkpoint-dir", str(original), "--quiet").returncode == 0
    shutil.copytree(original, copy)
    before = sorted(p.name for p in original.iterdir())
    proc = _cli("--resume", str(copy), "--max-updates", "20", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in original.iterdir()) == before
    assert (copy / "checkpoint-00000020").is_dir()


@pytest.mark.slow  # 12 s here (2 idle cores)
def test_resume_with_another_optimizer_fails_with_a_message(tmp_path):
    assert _cli("digits", "--max-updates", "2", "--max-epochs", "none", "--checkpoint-dir",
                str(tmp_path), "--quiet").returncode == 0
    proc = _cli("--resume", str(tmp_path), "--optimizer", "sgd", "--max-updates", "4")
    assert proc.returncode == 1 and "training failed" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(("made_by_caller", "fails", "left"), [
    (False, False, True), (False, True, False), (True, False, False)])
def test_the_cli_leaves_the_process_group_it_made_only_after_a_successful_run(
        monkeypatch, tmp_path, made_by_caller, fails, left):
    """Under torchrun the CLI makes the process group; a run that succeeded leaves it
    (``destroy_process_group``, as PyTorch asks, so gloo's threads stop before the
    interpreter's finalization); a failed one does not, since peers inside a collective
    would wait for it forever; a group the caller made before stays the caller's."""
    import torch.distributed as dist

    import trainers.cli
    from trainers.errors import TrainersError

    real_init = dist.init_process_group

    def init(backend, **kwargs):  # torchrun's environment, as one process on a file store
        real_init(backend, store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                  world_size=1)

    def broken_fit(*args, **kwargs):
        raise TrainersError("a rank's training failed")

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init_process_group", init)
    if fails:
        monkeypatch.setattr(trainers.cli, "fit", broken_fit)
    try:
        if made_by_caller:
            init("gloo")
        proc = run_main("digits", "--max-updates", "1", "--max-epochs", "none", "--quiet")
        assert proc.returncode == (1 if fails else 0), proc.stderr
        assert dist.is_initialized() == (not left)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_full_disk_fails_with_one_line_and_the_resume_hint(tmp_path, monkeypatch):
    from trainers import checkpoint

    real, calls = checkpoint.torch.save, []

    def full_at_the_second(obj, f, *a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(obj, f, *a, **kw)

    monkeypatch.setattr(checkpoint.torch, "save", full_at_the_second)
    root = tmp_path / "ck"
    proc = run_main("digits", "--width", "4", "--depth", "1", "--max-updates", "4",
                    "--max-epochs", "none", "--eval-interval", "2", "--checkpoint-dir", str(root),
                    "--quiet", "--no-checkpoint-fsync")
    assert proc.returncode == 1
    assert proc.stderr == (f"training failed: cannot write checkpoint {root}/checkpoint-00000004: "
                           f"OSError: [Errno 28] No space left on device; continue with "
                           f"--resume {root}\n")
    assert sorted(p.name for p in root.iterdir()) == ["best.json", "checkpoint-00000002"]


@pytest.mark.parametrize("checkpoints", [0, 1])
def test_ctrl_c_hints_resume_only_where_a_checkpoint_exists(checkpoints, tmp_path, monkeypatch):
    from trainers import checkpoint, cli

    root = tmp_path / "ck"

    def interrupted_fit(*args, **kwargs):
        if checkpoints:
            checkpoint.save_checkpoint(root, 3, {"x": 1}, {"step": 3}, keep_last=1,
                                       durable=False)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "fit", interrupted_fit)
    proc = run_main("digits", "--checkpoint-dir", str(root), "--quiet")
    assert proc.returncode == 130
    assert proc.stderr == ("interrupted; continue with --resume " + str(root) + "\n"
                           if checkpoints else "interrupted\n")


def test_summary_json_that_is_a_directory_is_refused_before_training(tmp_path, monkeypatch):
    from trainers import cli

    monkeypatch.setattr(cli, "fit", lambda *a, **kw: pytest.fail("trained"))
    proc = run_main("digits", "--summary-json", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"trainers: error: --summary-json: {tmp_path} is a directory; give a file path")


def test_a_checkpoints_option_key_is_printed_quoted_and_escaped(tmp_path):
    (tmp_path / "meta.json").write_text(json.dumps(
        {"task": "digits", "config": {}, "options": {"\x1b[31mX\x1b[0m": 1}}))
    proc = run_main("--resume", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "trainers: error: '\\x1b[31mX\\x1b[0m': not a training option nor an option of task "
        "'digits'")


def test_argparses_own_errors_print_the_arguments_escaped(tmp_path):
    proc = run_main("digits", "\x1b[31mX")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == "trainers: error: unrecognized arguments: \\x1b[31mX"
    proc = run_main("--resume", str(tmp_path / "\x1b[2J"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"trainers: error: --resume: no checkpoint under {tmp_path}/\\x1b[2J")


def test_a_failed_training_prints_its_message_escaped(monkeypatch):
    from trainers import cli
    from trainers.errors import CheckpointError

    def failing_fit(*args, **kwargs):
        raise CheckpointError("checkpoint 'x\x1b[2J' is broken\nforged line")

    monkeypatch.setattr(cli, "fit", failing_fit)
    proc = run_main("digits", "--quiet")
    assert proc.returncode == 1
    assert proc.stderr == "training failed: checkpoint 'x\\x1b[2J' is broken\\nforged line\n"


@pytest.mark.parametrize("error", [SyntaxError("invalid syntax (broken.py, line 3)"),
                                   ImportError("No module named 'missing_dependency'"),
                                   TypeError("'os:system' is not a trainers Task subclass")])
def test_a_task_that_cannot_be_loaded_is_one_line_naming_it(monkeypatch, error):
    """helper-32: an installed task whose module has a syntax error, misses a dependency
    or names no Task ended ``trainers TASK`` with a traceback; now exit 2, as for a bad
    task name."""
    import trainers.cli

    def broken(name):
        raise error

    monkeypatch.setattr(trainers.cli, "get_task", broken)
    proc = run_main("brk-task", "--max-epochs", "1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"trainers: error: task 'brk-task' cannot be loaded: {type(error).__name__}: {error}")
