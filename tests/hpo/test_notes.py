"""Metric names and the dashboard note of a study (issue 16.1)."""

from __future__ import annotations

import optuna
import pytest
from optuna_dashboard import get_note

from hpo.board import StudyBoard, note_failure
from hpo.notes import NoteEnd, cell, study_note
from hpo.record import Counts
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.study import create_study, open_study
from hpo.tune.driver import StudyOutcome, note_end

SPACE = {"lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
         "width": {"type": "int", "low": 8, "high": 64, "step": 8},
         "dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1},
         "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]}}


def spec_of(name: str = "noted", **over) -> object:
    data = {"name": name, "task": "digits", "config": {"max_epochs": 3},
            "search_space": SPACE, "objective": {"metric": "val_accuracy",
                                                 "direction": "maximize"},
            "sampler": {"name": "tpe", "seed": 7},
            "scheduler": {"name": "asha", "grace_period": 10, "reduction_factor": 3},
            "budget": {"n_trials": 12, "max_concurrent_trials": 2, "timeout_s": 600},
            "resources": {"cpus": 2, "gpus": 0.5},
            "warm_start": [{"study": "earlier", "top_k": 3}, {"params": {"lr": 0.01}}],
            **over}
    return parse_spec(data, check_task=False)


MULTI = [{"metric": "val_loss", "direction": "minimize"},
         {"metric": "val_accuracy", "direction": "maximize"}]


@pytest.mark.parametrize("objective, names", [
    ({"metric": "val_accuracy", "direction": "maximize"}, ["val_accuracy"]),
    (MULTI, ["val_loss", "val_accuracy"])])
def test_the_service_create_names_the_metrics(sqlite_url, objective, names):
    spec = spec_of(objective=objective)
    storage = open_storage(sqlite_url)
    create_study(spec, storage)
    assert optuna.load_study(study_name=spec.name, storage=storage).metric_names == names


@pytest.mark.parametrize("objective, names", [
    ({"metric": "val_accuracy", "direction": "maximize"}, ["val_accuracy"]),
    (MULTI, ["val_loss", "val_accuracy"])])
def test_hpo_run_open_names_the_metrics_of_a_new_and_of_an_unnamed_study(sqlite_url,
                                                                         objective, names):
    spec = spec_of(objective=objective)
    storage = open_storage(sqlite_url)
    assert open_study(spec, storage).metric_names == names
    other = spec_of("made-elsewhere", objective=objective)  # created without names
    optuna.create_study(storage=storage, study_name=other.name,
                        directions=[o.direction for o in other.objectives])
    assert open_study(other, storage).metric_names == names
    assert optuna.load_study(study_name=other.name, storage=storage).metric_names == names


def test_note_gives_the_spec_as_tables():
    note = study_note(spec_of(), owner="alice")
    lines = note.splitlines()
    assert lines[0] == "# noted"
    for row in ["| task | `digits` |",
                "| owner | alice |",
                "| objective | `val_accuracy` (maximize) |",
                "| sampler | tpe, seed 7 (n_startup_trials=4, multivariate=false, "
                "constant_liar=true) |",
                "| scheduler | asha (grace_period=10, reduction_factor=3, brackets=1) |",
                "| budget | 12 trials, at most 2 at a time, time budget 600 s |",
                "| resources per trial | 2 CPU, 0.5 GPU per worker, 1 worker |",
                "| warm start | study earlier (top 3); 1 point |",
                "| name | kind | low | high | log | step | choices |",
                "| `lr` | float | 0.0001 | 0.1 | yes |  |  |",
                "| `width` | int | 8 | 64 | no | 8 |  |",
                "| `dropout` | float | 0 | 0.5 | no | 0.1 |  |",
                "| `optimizer` | categorical |  |  |  |  | adamw, sgd |",
                "| `max_epochs` | 3 |",
                "Status: **RUNNING**"]:
        assert row in lines, (row, note)
    assert "## Outcome" not in note


def test_note_of_a_pbt_study_names_ray_s_population_and_the_pruner_of_an_optuna_one():
    pbt = spec_of(scheduler={"name": "pbt", "perturbation_interval": 23}, warm_start=[])
    lines = study_note(pbt).splitlines()
    assert "| sampler | Ray's variant generator (the population of pbt), seed 7 |" in lines
    assert "| scheduler | pbt (perturbation_interval=23, quantile_fraction=0.25, " \
           "resample_probability=0.25) |" in lines
    assert "| warm start | none |" in lines
    assert not any(line.startswith("| owner") for line in lines)
    pruned = spec_of(scheduler={"name": "optuna-pruner", "pruner": {"name": "median"}})
    assert "| scheduler | optuna-pruner (pruner=median(n_startup_trials=5, n_warmup_steps=0, " \
           "interval_steps=1, n_min_trials=1)) |" in study_note(pruned).splitlines()


def test_note_after_the_end_gives_status_and_best_trial():
    end = NoteEnd("COMPLETED", 9, 2, 1, (7, 0.975, {"lr": 0.003, "optimizer": "sgd"}))
    note = study_note(spec_of(), end=end)
    tail = note[note.index("## Outcome"):]
    assert tail == ("## Outcome\n\n**COMPLETED**: 9 complete, 2 pruned, 1 failed.\n\n"
                    "Best trial: **7**, `val_accuracy` = 0.975\n\n"
                    "| parameter | value |\n| --- | --- |\n"
                    "| `lr` | 0.003 |\n| `optimizer` | sgd |\n")
    assert "Status: **RUNNING**" not in note


def test_note_of_a_multi_objective_end_gives_the_pareto_front_size():
    end = note_end(StudyOutcome("m", Counts(complete=5, pruned=1), stopped=True,
                                interrupted=False, best_number=None, best_value=None,
                                best_params=None,
                                pareto_front=[(1, [0.1, 0.9], {}), (3, [0.2, 0.95], {})]))
    assert end == NoteEnd("STOPPED", 5, 1, 0, None, 2)
    tail = study_note(spec_of(objective=MULTI), end=end).split("## Outcome")[1]
    assert tail == "\n\n**STOPPED**: 5 complete, 1 pruned, 0 failed.\n\n" \
                   "Pareto front: **2** trials\n"


def test_note_end_of_an_interrupted_run_and_of_one_without_a_complete_trial():
    end = note_end(StudyOutcome("s", Counts(pruned=3), stopped=False, interrupted=True,
                                best_number=None, best_value=None, best_params=None))
    assert end == NoteEnd("INTERRUPTED", 0, 3, 0, None, None)
    assert study_note(spec_of(), end=end).endswith(
        "**INTERRUPTED**: 0 complete, 3 pruned, 0 failed.\n\nNo trial completed.\n")


def test_cells_stay_one_escaped_line():
    assert cell("a|b\nc <script>") == "a\\|b c &lt;script&gt;"
    assert cell(None) == "null" and cell(True) == "true" and cell(2.5e-05) == "2.5e-05"
    assert len(cell("x" * 500)) == 200


def test_board_writes_the_note_at_the_start_and_the_outcome_at_the_end(sqlite_url):
    spec = spec_of()
    study = open_study(spec, open_storage(sqlite_url))
    board = StudyBoard(study, spec, owner="alice")
    board.started()
    assert get_note(study) == study_note(spec, "alice")
    end = NoteEnd("FAILED", error="ClusterError: cannot reach the Ray cluster")
    board.ended(end)
    again = optuna.load_study(study_name=spec.name, storage=sqlite_url)
    assert get_note(again) == study_note(spec, "alice", end)
    assert get_note(again).endswith("## Outcome\n\n**FAILED**.\n\n"
                                     "Error: ClusterError: cannot reach the Ray cluster\n")


def test_a_failure_before_the_start_is_noted_only_on_a_stored_study(sqlite_url):
    storage = open_storage(sqlite_url)
    spec = spec_of()
    note_failure(storage, spec, "bob", "SpecError: scheduler.grace_period: too large")
    assert optuna.get_all_study_names(storage) == []  # nothing stored for a study not stored
    create_study(spec, storage)
    note_failure(storage, spec, "bob", "SpecError: scheduler.grace_period: too large")
    note = get_note(optuna.load_study(study_name=spec.name, storage=storage))
    assert "| owner | bob |" in note.splitlines()
    assert note.endswith("**FAILED**.\n\nError: SpecError: scheduler.grace_period: too large\n")


def test_note_of_a_study_stopped_by_its_stop_when_rule_says_which_rule_fired():
    spec = spec_of(budget={"n_trials": 12, "max_concurrent_trials": 2,
                           "stop_when": {"no_improvement_trials": 4, "min_delta": 0.001}})
    reason = ("stop_when.no_improvement_trials: 4 trials finished since trial 2 set the best "
              "val_accuracy 0.97, none improving it by more than 0.001 "
              "(when 7 trials had finished)")
    end = note_end(StudyOutcome("s", Counts(complete=7), stopped=False, interrupted=False,
                                best_number=2, best_value=0.97, best_params={"lr": 0.01},
                                stop_reason=reason))
    assert end == NoteEnd("COMPLETED", 7, 0, 0, (2, 0.97, {"lr": 0.01}), None,
                          stop_reason=reason)
    note = study_note(spec, end=end)
    assert "| budget | 12 trials, at most 2 at a time, stop when no_improvement_trials=4, " \
           "min_delta=0.001 |" in note
    assert note[note.index("## Outcome"):].startswith(
        f"## Outcome\n\n**COMPLETED**: 7 complete, 0 pruned, 0 failed.\n\n"
        f"Stopped early: {reason}\n\nBest trial: **2**")


def test_note_lists_the_constraints():
    note = study_note(spec_of(constraints=[{"metric": "peak_memory_bytes", "max": 2.0e8},
                                           {"metric": "val_loss", "min": 0.1}]))
    assert "| constraints | `peak_memory_bytes` ≤ 2e+08, `val_loss` ≥ 0.1 |" in note
    assert "| constraints |" not in study_note(spec_of())


@pytest.mark.parametrize("objective", [None, MULTI], ids=["one-objective", "front"])
def test_the_note_of_a_study_whose_complete_trials_all_break_a_constraint_says_so(objective):
    """The breaker: such a note said "3 complete" and then "No trial completed"."""
    end = note_end(StudyOutcome("c", Counts(complete=3), stopped=False, interrupted=False,
                                best_number=None, best_value=None, best_params=None,
                                pareto_front=[] if objective else None))
    over = {"constraints": [{"metric": "peak_memory_bytes", "max": 1.0}]}
    spec = spec_of(**over, **({"objective": objective} if objective else {}))
    assert study_note(spec, end=end).endswith(
        "**COMPLETED**: 3 complete, 0 pruned, 0 failed.\n\n"
        "No complete and feasible trial: every complete trial breaks a constraint.\n")
