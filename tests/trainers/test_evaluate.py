"""Model files (``trainers.model_file``) and ``python -m trainers evaluate``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainers
from tests.trainers.cli_in_process import run_main
from trainers import checkpoint as ckpt
from trainers import model_file
from trainers.errors import CheckpointError, TrainersError
from trainers.model_file import (
    FORMAT,
    FORMAT_VERSION,
    check_weights_size,
    evaluate_model,
    load_model_file,
    model_from_checkpoint,
    save_model_file,
    stored_values,
)

REPO = Path(__file__).resolve().parents[2]
TINY = {"max_updates": 12, "max_epochs": None, "eval_interval": 6, "micro_batch_size": 32,
        "width": 8, "lr": 0.01, "device": "cpu"}


def _train(tmp_path: Path, **changes) -> trainers.TrainResult:
    task, config = trainers.create("digits", {**TINY, **changes,
                                              "checkpoint_dir": str(tmp_path / "ckpt")})
    return trainers.fit(task, config)


def _same(state_a: dict, state_b: dict) -> bool:
    return state_a.keys() == state_b.keys() and all(
        torch.equal(state_a[k].cpu(), state_b[k].cpu()) for k in state_a)


def test_model_file_holds_the_ema_weights_when_the_run_used_ema(tmp_path):
    result = _train(tmp_path, ema_decay=0.9)
    model = model_from_checkpoint(ckpt.latest_checkpoint(tmp_path / "ckpt"),
                                  origin={"trial": 3})
    assert model["format"] == FORMAT and model["format_version"] == FORMAT_VERSION
    assert model["task"] == "digits" and model["options"]["width"] == 8
    assert model["config"]["ema_decay"] == 0.9 and model["config"]["max_updates"] == 12
    assert model["config"]["checkpoint_dir"] is None  # a path of the training machine
    assert str(tmp_path) not in repr({k: v for k, v in model.items() if k != "weights"})
    assert model["weights_kind"] == "ema" and model["step"] == 12
    assert _same(model["weights"], result.ema_model.state_dict())
    assert not _same(model["weights"], result.model.state_dict())
    assert model["metrics"] == result.metrics
    assert model["origin"] == {"trial": 3}


def test_model_file_holds_the_trained_weights_without_ema(tmp_path):
    result = _train(tmp_path)
    model = model_from_checkpoint(tmp_path / "ckpt")  # a root: its newest checkpoint
    assert model["weights_kind"] == "model" and model["config"]["ema_decay"] is None
    assert _same(model["weights"], result.model.state_dict())


def test_model_file_holds_the_trained_weights_when_ema_is_not_evaluated(tmp_path):
    result = _train(tmp_path, ema_decay=0.9, eval_with_ema=False)
    model = model_from_checkpoint(tmp_path / "ckpt")
    assert model["weights_kind"] == "model"
    assert _same(model["weights"], result.model.state_dict())


@pytest.mark.parametrize("ema", [None, 0.8])
def test_evaluating_the_file_gives_the_runs_final_metrics(tmp_path, ema):
    result = _train(tmp_path, ema_decay=ema)
    path = save_model_file(model_from_checkpoint(tmp_path / "ckpt"), tmp_path / "m.pt")
    metrics = evaluate_model(load_model_file(path))
    assert set(metrics) == {"val_accuracy", "val_loss"}
    for key, value in metrics.items():
        assert value == pytest.approx(result.metrics[key], abs=1e-6), key
    assert list(tmp_path.glob(".*.tmp")) == []  # written atomically, no leftover


def test_a_sharded_fsdp_checkpoint_gives_the_full_weights_and_the_runs_metrics(tmp_path):
    result = _train(tmp_path, ema_decay=0.8, parallelism="fsdp")  # one process: one shard
    assert (ckpt.latest_checkpoint(tmp_path / "ckpt") / ckpt.SHARDED_STATE_FILE).is_file()
    model = model_from_checkpoint(tmp_path / "ckpt")
    assert model["weights_kind"] == "ema" and model["config"]["parallelism"] == "fsdp"
    plain = trainers.create("digits", {**TINY, "device": "cpu"})[0].build_model(
        trainers.TrainConfig()).state_dict()
    assert model["weights"].keys() == plain.keys()
    assert all(type(t) is torch.Tensor for t in model["weights"].values())  # not DTensors
    metrics = evaluate_model(model)
    for key, value in metrics.items():
        assert value == pytest.approx(result.metrics[key], abs=1e-6), key


def test_a_task_option_override_that_changes_the_model_is_refused_by_the_weights(tmp_path):
    _train(tmp_path)
    model = model_from_checkpoint(tmp_path / "ckpt")
    with pytest.raises(CheckpointError, match="do not fit task 'digits'"):
        evaluate_model(model, {"width": 16})


def test_load_refuses_what_is_not_a_model_file(tmp_path):
    torch.save({"weights": {}}, tmp_path / "x.pt")
    with pytest.raises(CheckpointError, match="not a model file"):
        load_model_file(tmp_path / "x.pt")
    torch.save({"format": FORMAT, "format_version": FORMAT_VERSION + 1}, tmp_path / "y.pt")
    with pytest.raises(CheckpointError, match=f"format version {FORMAT_VERSION + 1}"):
        load_model_file(tmp_path / "y.pt")
    with pytest.raises(CheckpointError, match="no such model file"):
        load_model_file(tmp_path / "missing.pt")
    (tmp_path / "spec.yaml").write_text("name: a\n")  # a spec given by mistake
    with pytest.raises(CheckpointError) as e:
        load_model_file(tmp_path / "spec.yaml")
    assert str(e.value) == (f"cannot read {tmp_path / 'spec.yaml'} as a model file (a torch "
                            "file of tensors and plain values): UnpicklingError")
    assert "weights_only" not in str(e.value)  # torch's advice to unpickle code


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainers", "evaluate", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


@pytest.mark.slow  # 5.6 s here (2 idle cores)
def test_cli_prints_the_metrics_as_one_json_line_and_takes_task_options(tmp_path):
    result = _train(tmp_path, ema_decay=0.8)
    path = save_model_file(model_from_checkpoint(tmp_path / "ckpt"), tmp_path / "m.pt")
    proc = _cli(str(path), "--task-option", "eval_batch_size=7", "--task-option", "device=cpu")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    metrics = json.loads(lines[0])
    assert metrics["val_accuracy"] == pytest.approx(result.metrics["val_accuracy"], abs=1e-6)
    assert metrics["val_loss"] == pytest.approx(result.metrics["val_loss"], abs=1e-6)


def test_cli_bad_option_or_file_exits_2_naming_it(tmp_path):
    _train(tmp_path)
    path = save_model_file(model_from_checkpoint(tmp_path / "ckpt"), tmp_path / "m.pt")
    cases = {("--task-option", "bogus=1"): "'bogus'", ("--task-option", "width"): "KEY=VALUE",
             ("--task-option", "width=wide"): "width: expected int"}
    for args, text in cases.items():
        proc = run_main("evaluate", str(path), *args)
        assert proc.returncode == 2 and text in proc.stderr, (args, proc.stderr)
    proc = run_main("evaluate", str(tmp_path / "nothing.pt"))
    assert proc.returncode == 2 and "no such model file" in proc.stderr


_HEAD = {"format": FORMAT, "format_version": FORMAT_VERSION, "task": "digits", "options": {},
         "config": {}, "weights": {}, "weights_kind": "model", "step": 0, "metrics": {},
         "origin": {}}


@pytest.mark.parametrize(("change", "problem"), [
    ({"task": None}, "it lacks 'task'"),
    ({"config": None}, "it lacks 'config'"),
    ({"options": None}, "it lacks 'options'"),
    ({"weights": None}, "it lacks 'weights'"),
    ({"task": ["digits"]}, "'task' must be a str, got list"),
    ({"options": [1]}, "'options' must be a dict, got list"),
    ({"config": "x"}, "'config' must be a dict, got str"),
    ({"options": {1: 2}}, "the keys of 'options' must be strings"),
    ({"weights": "x"}, "'weights' must be a dict, got str"),
    ({"weights": {"conv.weight": "x"}}, "'weights' must map names to tensors, got 'conv.weight'"),
])
def test_evaluate_refuses_a_malformed_model_file_with_exit_2_naming_the_field(
        change, problem, tmp_path):
    model = {k: v for k, v in {**_HEAD, **change}.items() if v is not None}
    path = tmp_path / "m.pt"
    torch.save(model, path)
    proc = run_main("evaluate", str(path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"trainers evaluate: error: {path} is not a valid model file: {problem}")


def test_evaluate_takes_no_path_option_from_the_file(tmp_path, monkeypatch):
    """A file could make the evaluation read any file (``corpus``) and write where it says
    (``cache_dir``): both come from the defaults or --task-option only."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    secret, corpus = tmp_path / "secret.txt", tmp_path / "corpus.txt"
    secret.write_text("secret " * 200)
    corpus.write_text("abcdefgh " * 200)
    options = {"corpus": str(secret), "cache_dir": str(tmp_path / "chosen"), "block_size": 8,
               "d_model": 8, "n_head": 1, "n_layer": 1, "val_fraction": 0.5}
    path = tmp_path / "m.pt"
    torch.save({**_HEAD, "task": "charlm", "options": options, "config": {"device": "cpu"}},
               path)
    proc = run_main("evaluate", str(path), "--task-option", f"corpus={corpus}")
    assert proc.returncode == 2 and "weights do not fit task 'charlm'" in proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"note: the file's cache_dir={str(tmp_path / 'chosen')!r} is not used (a path option "
        "is taken only from --task-option cache_dir=...)")
    assert "corpus=" not in proc.stderr.splitlines()[1]  # given: no note
    assert not (tmp_path / "chosen").exists()
    [cache] = (tmp_path / "xdg" / "hpo").iterdir()  # the default cache, of the given corpus
    assert json.loads((cache / "vocab.json").read_text()) == " abcdefgh"


# -- a model file cannot ask for any size of model; what the file says is printed escaped --

_HUGE = {"d_model": 8192, "n_layer": 48, "n_head": 8, "block_size": 4096, "val_fraction": 0.5}
"""The options of a crafted 2.9 KB model file (``weights`` empty) that made the evaluation
allocate 38.7 billion parameters, 155 GB, until the OOM killer came."""

_SMALL = {"d_model": 8, "n_head": 1, "n_layer": 1, "block_size": 8}


@pytest.fixture
def corpus(tmp_path, monkeypatch) -> Path:
    """A corpus of 18,000 characters, a vocabulary of 9; its cache under ``tmp_path``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "corpus.txt"
    path.write_text("abcdefgh " * 2000)
    return path


def _digits_file(tmp_path: Path, **changes) -> Path:
    """A model file of an untrained ``digits`` model (width 8), no training needed."""
    task, config = trainers.create("digits", {"width": 8, "device": "cpu"})
    model = {**_HEAD, "options": {"width": 8}, "config": {"device": "cpu"},
             "weights": task.build_model(config).state_dict(), **changes}
    torch.save(model, tmp_path / "m.pt")
    return tmp_path / "m.pt"


@pytest.mark.parametrize(("weights", "held"), [
    ({}, "0 values"),
    ({"tok_emb.weight": torch.zeros(1).expand(10**6, 10**5)}, "1 value"),  # a view of 1 value
    ({"tok_emb.weight": torch.empty(10**6, 10**5, device="meta")}, "0 values"),  # no memory
])
def test_evaluate_refuses_a_model_larger_than_the_files_weights_before_building_it(
        weights, held, corpus, tmp_path, monkeypatch):
    monkeypatch.setattr(model_file, "build_run", lambda *a: pytest.fail("the model was built"))
    path = tmp_path / "m.pt"
    torch.save({**_HEAD, "task": "charlm", "options": _HUGE, "weights": weights}, path)
    proc = run_main("evaluate", str(path), "--task-option", f"corpus={corpus}")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "trainers evaluate: error: the model file's weights do not fit task 'charlm' with "
        f"these options: 'weights' holds {held}, the model has 38,693,462,016 parameters")


def test_a_task_option_that_makes_the_model_larger_than_the_weights_is_refused_unbuilt(
        tmp_path, monkeypatch):
    monkeypatch.setattr(model_file, "build_run", lambda *a: pytest.fail("the model was built"))
    proc = run_main("evaluate", str(_digits_file(tmp_path)), "--task-option", "width=16")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "trainers evaluate: error: the model file's weights do not fit task 'digits' with "
        "these options: 'weights' holds 2,004 values, the model has 5,082 parameters")


def test_a_charlm_models_weights_hold_its_parameters_counted_once_its_corpus_is_read(corpus):
    """Before the corpus is read ``charlm`` counts a vocabulary of 256, more than this
    corpus's 9: the check reads the data first, or it would refuse every such file."""
    params = {**_SMALL, "corpus": str(corpus), "device": "cpu"}
    task, config = trainers.create("charlm", params)
    before = task.parameter_count(config)
    weights = task.build_model(config).state_dict()  # the head's weight is the embedding's
    assert stored_values(weights) == task.parameter_count(config) == 1_024 < before == 3_000
    check_weights_size(*trainers.create("charlm", params), weights)  # no error
    model = {**_HEAD, "task": "charlm", "options": _SMALL, "config": {"device": "cpu"},
             "weights": weights}
    assert set(evaluate_model(model, {"corpus": str(corpus)})) == {"val_loss", "val_bpc"}


def test_running_out_of_memory_is_one_line_and_exit_1(tmp_path, monkeypatch):
    """A real failure of torch's CPU allocator (2 EiB asked for while evaluating)."""
    def allocates(*args, **kwargs):
        return torch.empty(2**58, dtype=torch.int64)

    monkeypatch.setattr(model_file, "evaluate", allocates)
    proc = run_main("evaluate", str(_digits_file(tmp_path)))
    assert proc.returncode == 1
    assert proc.stderr == ("evaluation failed: out of memory: tried to allocate "
                           "2,305,843,009,213,693,952 bytes\n")


@pytest.mark.parametrize(("error", "message"), [
    (MemoryError(), "out of memory"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a "
                            "total capacity of 79.19 GiB of which 1.2 GiB is free."),
     "out of memory: tried to allocate 20.00 GiB"),
])
def test_out_of_memory_in_the_evaluation_is_one_line_and_exit_1(error, message, tmp_path,
                                                                 monkeypatch):
    def out_of_memory(*args, **kwargs):
        raise error

    monkeypatch.setattr(model_file, "evaluate", out_of_memory)
    proc = run_main("evaluate", str(_digits_file(tmp_path)))
    assert proc.returncode == 1
    assert proc.stderr == f"evaluation failed: {message}\n"


def test_another_runtime_error_of_the_evaluation_keeps_its_traceback(tmp_path, monkeypatch):
    def bug(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(model_file, "evaluate", bug)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        evaluate_model(load_model_file(_digits_file(tmp_path)))
    assert not issubclass(RuntimeError, TrainersError)


def test_evaluate_prints_a_files_option_key_quoted_and_escaped(tmp_path):
    path = _digits_file(tmp_path, options={"width": 8, "\x1b[31mX\x1b[0m": 1})
    proc = run_main("evaluate", str(path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "trainers evaluate: error: '\\x1b[31mX\\x1b[0m': not a training option nor an option "
        "of task 'digits'")


def test_evaluate_prints_a_files_weight_names_and_a_path_escaped(tmp_path):
    weights = torch.load(_digits_file(tmp_path), weights_only=True)["weights"]
    path = _digits_file(tmp_path, weights={**weights, "\x1b[2J": torch.zeros(1)})
    proc = run_main("evaluate", str(path))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "trainers evaluate: error: the model file's weights do not fit task 'digits' with "
        "these options: Error(s) in loading state_dict for DigitsCNN:\\n\\tUnexpected "
        "key(s) in state_dict: \"\\x1b[2J\". ")
    proc = run_main("evaluate", str(tmp_path / "\x1b[31m.pt"))
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"trainers evaluate: error: no such model file: {tmp_path}/\\x1b[31m.pt")
    assert "\x1b" not in proc.stderr


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_metric_is_printed_as_json_null(tmp_path, monkeypatch, value):
    """helper-32: a diverged model's NaN loss was printed as ``NaN``, which no JSON reader
    takes (the README promises one JSON object)."""
    import trainers.evaluate

    monkeypatch.setattr(trainers.evaluate, "evaluate_model",
                        lambda model, given: {"val_loss": value, "val_accuracy": 0.5})
    proc = run_main("evaluate", str(_digits_file(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout, parse_constant=pytest.fail) == {
        "val_loss": None, "val_accuracy": 0.5}


@pytest.mark.parametrize("error", [KeyError("val_r2"), SyntaxError("invalid syntax"),
                                   RuntimeError("the task's own bug")])
def test_a_failure_in_the_tasks_own_code_is_one_line_and_exit_1(tmp_path, monkeypatch, error):
    """helper-32: a task whose module does not import, or whose metrics raise, ended
    ``trainers evaluate`` with a traceback, where the README promises one line."""
    import trainers.evaluate

    def fails(model, given):
        raise error

    monkeypatch.setattr(trainers.evaluate, "evaluate_model", fails)
    proc = run_main("evaluate", str(_digits_file(tmp_path)))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr == f"evaluation failed: {type(error).__name__}: {error}\n"
