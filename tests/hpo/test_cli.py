"""``hpo run``: a study from a spec file, its progress and best trial; bad specs exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
HPO = [sys.executable, "-m", "hpo"]


def _spec(path: Path, **changes) -> Path:
    data = {"name": "cli-study", "task": "toy-hpo",
            "config": {"max_updates": 6, "max_epochs": None, "eval_interval": 3},
            "search_space": {"quality": {"type": "float", "low": 0.0, "high": 1.0}},
            "objective": {"metric": "val_loss"}, "budget": {"n_trials": 2},
            **changes}
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.ray
def test_run_exits_3_naming_the_first_reason_when_every_trial_failed(tmp_path):
    """helper-41: a study whose every trial failed (a broken task) exited 0."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    spec = _spec(tmp_path / "s.yaml", config={"max_updates": 6, "max_epochs": None,
                                              "eval_interval": 3, "fail_at_update": 2})
    proc = subprocess.run([*HPO, "run", str(spec), "--storage", url, "--results-dir",
                           str(tmp_path / "ray"), "--num-cpus", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "2 trials finished (0 complete, 0 pruned, 2 failed)" in proc.stdout
    assert proc.stderr.rstrip().endswith(
        "error: every trial failed; the first: RuntimeError: toy failure at update 2")


@pytest.mark.ray
def test_run_prints_progress_and_best_trial(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    proc = subprocess.run([*HPO, "run", str(_spec(tmp_path / "s.yaml")), "--storage", url,
                           "--results-dir", str(tmp_path / "ray"), "--num-cpus", "2"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "study progress" in proc.stderr
    assert "2 trials finished (2 complete, 0 pruned, 0 failed)" in proc.stdout
    assert "best trial #" in proc.stdout and "quality = " in proc.stdout
    study = optuna.load_study(study_name="cli-study", storage=url)
    assert len(study.trials) == 2
    # again: nothing left to run; the table showed 0/2 finished and no best (a new user)
    again = subprocess.run([*HPO, "run", str(_spec(tmp_path / "s.yaml")), "--storage", url,
                            "--results-dir", str(tmp_path / "ray"), "--num-cpus", "2"],
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    table = again.stderr[again.stderr.rindex("study progress"):]
    row = next(line for line in table.splitlines() if "/2" in line).split()
    assert row[1:7:1] == ["2/2", "│", "0", "│", "2", "│"], table
    assert "(#" in table and "trials finished" not in table


def test_invalid_spec_exits_2_naming_each_field(tmp_path):
    spec = _spec(tmp_path / "bad.yaml", search_space={
        "quality": {"type": "float", "low": 0, "high": 1, "log": True},
        "qualty": {"type": "int", "low": 1, "high": 2}}, budget={"n_trials": 0})
    proc = subprocess.run([*HPO, "run", str(spec), "--storage",
                           f"sqlite:///{tmp_path / 'x.db'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "budget.n_trials" in proc.stderr
    assert "search_space.quality.low" in proc.stderr
    assert not (tmp_path / "x.db").exists()  # nothing stored
    # one line per problem, however long (rich wrapped them at 80 columns off a terminal)
    long = _spec(tmp_path / "long.yaml", sampler={"name": "tpee"})
    proc = subprocess.run([*HPO, "run", str(long), "--storage", f"sqlite:///{tmp_path / 'x.db'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "  sampler.name: unknown name 'tpee' (did you mean 'tpe'?); one of tpe, random, grid, "
        "gp, cmaes, nsga2")
    missing = subprocess.run([*HPO, "run", str(tmp_path / "nope.yaml")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "cannot read" in missing.stderr


@pytest.mark.slow  # 12 s here (2 idle cores)
def test_a_cluster_that_is_down_is_a_clear_error_at_once(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = s.getsockname()[1]
        proc = subprocess.run([*HPO, "run", str(_spec(tmp_path / "s.yaml")), "--storage",
                               f"sqlite:///{tmp_path / 'x.db'}", "--ray-address",
                               f"127.0.0.1:{port}"],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in proc.stderr


@pytest.mark.parametrize("flags, flag", [
    (["--results-dir", "{file}"], "--results-dir"),
    (["--results-dir", "{file}/sub"], "--results-dir"),
    (["--results-dir", "/proc/hpo-no-such"], "--results-dir"),
    (["--results-dir", "{tmp}/ok", "--artifact-dir", "{file}"], "--artifact-dir"),
    (["--results-dir", "{file_parent}"], "--artifact-dir"),  # RESULTS_DIR/artifacts: a file
])
def test_an_unusable_directory_exits_2_naming_its_flag_before_ray_starts(
        tmp_path, monkeypatch, flags, flag):
    """The breaker: ``--results-dir FILE`` (or ``--artifact-dir``) started a local Ray, then
    ended in a traceback with exit 1."""
    from typer.testing import CliRunner

    import hpo.cli
    import hpo.tune.driver

    started = []
    monkeypatch.setattr(hpo.tune.driver, "init_ray", lambda *a: started.append(a))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "r" / "artifacts").parent.mkdir()
    (tmp_path / "r" / "artifacts").write_text("x")
    values = {"file": tmp_path / "afile", "tmp": tmp_path, "file_parent": tmp_path / "r"}
    args = ["run", str(_spec(tmp_path / "s.yaml")), "--storage",
            f"sqlite:///{tmp_path / 'x.db'}", *[f.format(**values) for f in flags]]
    result = CliRunner().invoke(hpo.cli.app, args, env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert f"error: {flag} " in result.output and "cannot be used as a directory" in \
        result.output
    assert "Traceback" not in result.output and started == []
    assert not (tmp_path / "x.db").exists()


def test_num_cpus_beyond_what_ray_takes_exits_2_naming_the_flag(tmp_path):
    from typer.testing import CliRunner

    import hpo.cli

    for command in (["run", str(_spec(tmp_path / "s.yaml"))], ["worker", "--address", "h:1"]):
        result = CliRunner().invoke(hpo.cli.app, [*command, "--num-cpus", str(10**20)],
                                    env={"COLUMNS": "1000"})
        assert result.exit_code == 2, result.output
        assert "--num-cpus" in result.output


@pytest.mark.parametrize("storage", ["foo://x", "sqlite:///{tmp}/afile/x.db",
                                     "postgresql+psycopg://postgres@127.0.0.1:1/none"])
def test_storage_that_cannot_be_opened_fails_before_ray_starts(tmp_path, monkeypatch, storage):
    """The breaker: ``--storage foo://x`` started a local Ray and drew the progress table
    before the error."""
    from typer.testing import CliRunner

    import hpo.cli
    import hpo.tune.driver

    started = []
    monkeypatch.setattr(hpo.tune.driver, "init_ray", lambda *a: started.append(a))
    (tmp_path / "afile").write_text("x")
    result = CliRunner().invoke(hpo.cli.app, [
        "run", str(_spec(tmp_path / "s.yaml")), "--storage", storage.format(tmp=tmp_path),
        "--results-dir", str(tmp_path / "runs")], env={"COLUMNS": "1000"})
    assert result.exit_code == 1, result.output
    assert "error: cannot open storage" in result.output
    assert "study progress" not in result.output and started == []
