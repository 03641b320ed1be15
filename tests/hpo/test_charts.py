"""The study page's charts (issue 16.2): PBT lineage, rungs, cost; their writer."""

from __future__ import annotations

import datetime
import json

import optuna
import optuna_dashboard
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from hpo.board import StudyBoard
from hpo.charts import (
    COST_ID,
    LINEAGE_ID,
    RUNGS_ID,
    cost_figure,
    lineage_figure,
    rung_budgets,
    rung_counts,
    rung_figure,
    schedule,
    study_figures,
)
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.study import open_study

T0 = datetime.datetime(2026, 12, 1, 12, 0, 0)


def spec_of(scheduler: dict, objective=None, space=None, name: str = "charted"):
    return parse_spec({
        "name": name, "task": "digits",
        "search_space": space or {
            "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
            "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]}},
        "objective": objective or {"metric": "val_accuracy", "direction": "maximize"},
        "scheduler": scheduler, "budget": {"n_trials": 8}}, check_task=False)


def trial(number: int, state=TrialState.COMPLETE, *, value=None, values=None, params=None,
          steps=(), attrs=None, ended_s: float | None = None):
    dists = {"lr": FloatDistribution(1e-4, 0.1, log=True),
             "optimizer": CategoricalDistribution(["adamw", "sgd"])}
    params = params or {}
    t = create_trial(state=state, value=value, values=values, params=params,
                     distributions={k: dists[k] for k in params},
                     intermediate_values={s: 0.5 for s in steps}, user_attrs=attrs or {})
    t.number = number
    if ended_s is not None:
        t.datetime_complete = T0 + datetime.timedelta(seconds=ended_s)
    return t


def exploit(donor, step, old, new):
    return {"donor_trial": donor, "step": step, "old": old, "new": new}


# -- lineage -------------------------------------------------------------------------------

def population():
    """Three members: trial 0 copies trial 2 at step 20, trial 1 copies trial 0 at step 40."""
    return [
        trial(0, params={"lr": 0.001, "optimizer": "adamw"}, value=0.9, steps=(20, 40, 60),
              attrs={"exploits": [exploit(2, 20, {"lr": 0.001, "optimizer": "adamw"},
                                          {"lr": 0.004, "optimizer": "sgd"})]}),
        trial(1, params={"lr": 0.002, "optimizer": "adamw"}, value=0.8, steps=(20, 40, 60),
              attrs={"exploits": [exploit(0, 40, {"lr": 0.002, "optimizer": "adamw"},
                                          {"lr": 0.005, "optimizer": "sgd"})]}),
        trial(2, params={"lr": 0.003, "optimizer": "sgd"}, value=0.95, steps=(20, 40, 60)),
    ]


def test_a_member_s_schedule_holds_each_value_until_its_exploit():
    assert schedule(population()[0], "lr") == [(0, 0.001), (20, 0.001), (20, 0.004),
                                                (60, 0.004)]
    assert schedule(population()[2], "optimizer") == [(0, "sgd"), (60, "sgd")]


def test_lineage_has_one_trace_per_member_per_hyperparameter_and_the_exploit_edges():
    fig = lineage_figure(spec_of({"name": "pbt", "perturbation_interval": 20}), population())
    assert fig.layout.title.text.startswith("PBT lineage")
    assert [a.text for a in fig.layout.annotations] == ["lr", "optimizer"]  # panel titles
    for axis in ["x", "x2"]:
        panel = [t for t in fig.data if t.xaxis == axis]
        assert [t.name for t in panel] == ["trial 0", "trial 1", "trial 2", "exploits"]
        assert [t.legendgroup for t in panel[:3]] == ["trial 0", "trial 1", "trial 2"]
        assert [t.showlegend for t in panel] == [axis == "x"] * 4
        edges = panel[3]
        assert list(edges.x) == [20, 20, None, 40, 40, None]
        assert list(edges.text) == ["trial 2 → trial 0 at step 20"] * 2 + [None] + \
                                   ["trial 0 → trial 1 at step 40"] * 2 + [None]
    lr_edges = [t for t in fig.data if t.xaxis == "x"][3]
    # from the donor's value at the step to the receiver's new value
    assert list(lr_edges.y) == [0.003, 0.004, None, 0.004, 0.005, None]
    opt_panel = [t for t in fig.data if t.xaxis == "x2"]
    assert list(opt_panel[3].y) == ["sgd", "sgd", None, "sgd", "sgd", None]
    assert list(opt_panel[1].x) == [0, 40, 40, 60]
    assert list(opt_panel[1].y) == ["adamw", "adamw", "sgd", "sgd"]
    assert fig.layout.yaxis.type == "log"  # lr is a log parameter


def test_an_exploit_without_a_known_donor_has_no_edge():
    members = population()
    members[0].user_attrs["exploits"][0]["donor_trial"] = None
    fig = lineage_figure(spec_of({"name": "pb2", "perturbation_interval": 20}), members)
    assert fig.layout.title.text.startswith("PB2 lineage")
    assert list([t for t in fig.data if t.xaxis == "x"][3].x) == [40, 40, None]


def test_lineage_shows_the_first_six_hyperparameters_and_says_how_many_more():
    space = {f"p{i}": {"type": "float", "low": 0.0, "high": 1.0} for i in range(8)}
    spec = spec_of({"name": "pbt", "perturbation_interval": 20}, space=space)
    members = [trial(n, value=0.5, steps=(10,)) for n in range(3)]
    fig = lineage_figure(spec, members)
    assert [a.text for a in fig.layout.annotations] == [f"p{i}" for i in range(6)]
    assert len(fig.data) == 6 * 4
    assert fig.layout.title.text.endswith("; 2 more hyperparameters not shown")


# -- rungs ---------------------------------------------------------------------------------

def rung_trials():
    return [
        trial(0, value=0.9, steps=(10, 30, 60, 90)),
        trial(1, TrialState.PRUNED, steps=(5, 10), attrs={"stopped_by": "asha",
                                                          "budget_updates": 10}),
        trial(2, TrialState.PRUNED, steps=(10, 20, 30, 35), attrs={"stopped_by": "asha",
                                                                   "budget_updates": 35}),
        trial(3, TrialState.PRUNED, steps=(4,), attrs={"stopped_by": "user",
                                                       "budget_updates": 4}),
        trial(4, TrialState.RUNNING, steps=(10, 30)),
        trial(5, TrialState.WAITING),
        trial(6, TrialState.FAIL, steps=(12,)),
    ]


def test_rung_budgets_follow_the_scheduler():
    asha = spec_of({"name": "asha", "max_t": 90, "grace_period": 10, "reduction_factor": 3})
    assert rung_budgets(asha, []) == [10, 30, 90]
    two = spec_of({"name": "asha", "max_t": 90, "grace_period": 10, "reduction_factor": 3,
                   "brackets": 2})
    assert rung_budgets(two, []) == [10, 30, 90]  # bracket 1: 30 and 90
    mo = spec_of({"name": "mo-asha", "max_t": 90, "grace_period": 10, "reduction_factor": 3})
    assert rung_budgets(mo, []) == [10, 30, 90]
    hyperband = spec_of({"name": "hyperband", "max_t": 27, "reduction_factor": 3})
    assert rung_budgets(hyperband, []) == [1, 3, 9, 27]
    halving = spec_of({"name": "optuna-pruner", "pruner": {
        "name": "successive-halving", "min_resource": 5, "reduction_factor": 2,
        "min_early_stopping_rate": 1}})
    assert rung_budgets(halving, rung_trials()) == [10, 20, 40, 80]  # up to 90 reached
    median = spec_of({"name": "optuna-pruner", "pruner": {"name": "median"}})
    assert rung_budgets(median, rung_trials()) == [4, 5, 10, 12, 20, 30, 35, 60, 90]
    many = [trial(0, value=0.5, steps=range(1, 101))]
    picked = rung_budgets(spec_of({"name": "median"}), many)
    assert len(picked) == 20 and picked[0] == 1 and picked[-1] == 100


def test_rung_counts_equal_a_hand_count():
    reached, stopped = rung_counts(rung_trials(), [10, 30, 90])
    # >= 10: trials 0, 1, 2, 4, 6; >= 30: 0, 2, 4; >= 90: 0 (5 is WAITING)
    assert reached == [5, 3, 1]
    # asha stopped 1 at 10 and 2 at 35 (rung 30); the user stopped 3 at 4 (below the first)
    assert stopped == {"asha": [1, 1, 0], "user": [1, 0, 0]}


def test_rung_figure_shows_the_counts_and_each_stopped_trial():
    spec = spec_of({"name": "asha", "max_t": 90, "grace_period": 10, "reduction_factor": 3})
    fig = rung_figure(spec, rung_trials())
    traces = {t.name: t for t in fig.data}
    assert fig.layout.title.text.startswith("Rungs")
    assert list(traces["reached"].x) == ["10", "30", "90"]
    assert list(traces["reached"].y) == [5, 3, 1]
    assert list(traces["stopped here by asha"].y) == [1, 1, 0]
    assert list(traces["stopped here by user"].y) == [1, 0, 0]
    assert (list(traces["stopped by asha"].x), list(traces["stopped by asha"].y)) == (
        [10, 35], [1, 2])
    assert list(traces["stopped by user"].text) == ["trial 3 stopped by user at 4 updates"]


# -- cost ----------------------------------------------------------------------------------

def cost_trials():
    return [
        trial(0, value=0.8, attrs={"device_seconds": 10.0}, ended_s=3),
        trial(1, TrialState.PRUNED, attrs={"device_seconds": 2.5}, ended_s=1),
        trial(2, value=0.7, attrs={"device_seconds": 4.0}, ended_s=2),
        trial(3, TrialState.FAIL, attrs={"device_seconds": 1.25}, ended_s=4),
        trial(4, TrialState.RUNNING),
    ]


def test_cost_totals_and_best_so_far_in_the_order_trials_ended():
    fig = cost_figure(spec_of({"name": "fifo"}), cost_trials(), "gpu")
    traces = {t.name: t for t in fig.data}
    assert fig.layout.title.text.startswith("Cost: 17.75 GPU-seconds in all")
    assert (list(traces["COMPLETE"].x), list(traces["COMPLETE"].y)) == ([0, 2], [10.0, 4.0])
    assert (list(traces["PRUNED"].x), list(traces["PRUNED"].y)) == ([1], [2.5])
    assert (list(traces["FAIL"].x), list(traces["FAIL"].y)) == ([3], [1.25])
    best = traces["best val_accuracy so far"]
    # ended 1 (2.5), 2 (6.5), 0 (16.5), 3 (17.75); the first COMPLETE is trial 2
    assert list(best.x) == [6.5, 16.5, 17.75]
    assert list(best.y) == [0.7, 0.8, 0.8]
    assert list(best.text) == ["after trial 2", "after trial 0", "after trial 3"]


def test_cost_of_a_multi_objective_study_has_a_best_line_per_objective():
    spec = spec_of({"name": "fifo"}, objective=[
        {"metric": "val_loss", "direction": "minimize"},
        {"metric": "val_accuracy", "direction": "maximize"}])
    trials = [trial(0, values=[0.5, 0.8], attrs={"device_seconds": 1.0}, ended_s=1),
              trial(1, values=[0.4, 0.7], attrs={"device_seconds": 2.0}, ended_s=2)]
    traces = {t.name: t for t in cost_figure(spec, trials).data}
    assert list(traces["best val_loss so far"].y) == [0.5, 0.4]
    assert list(traces["best val_accuracy so far"].y) == [0.8, 0.8]
    assert list(traces["best val_loss so far"].x) == [1.0, 3.0]


def test_each_scheduler_gets_its_charts():
    assert set(study_figures(spec_of({"name": "fifo"}), [])) == {COST_ID}
    assert set(study_figures(spec_of({"name": "pbt", "perturbation_interval": 5}), [])) == {
        COST_ID, LINEAGE_ID}
    assert set(study_figures(spec_of({"name": "asha"}), [])) == {COST_ID, RUNGS_ID}
    assert set(study_figures(spec_of({"name": "optuna-pruner",
                                      "pruner": {"name": "median"}}), [])) == {
        COST_ID, RUNGS_ID}


# -- the writer ----------------------------------------------------------------------------

def saved_figure(study: optuna.Study, graph_id: str) -> dict:
    """A saved graph object read back from the study's system attributes (optuna-dashboard
    keeps it in chunks ``dashboard:plot_data:<id>:<i>``)."""
    prefix = f"dashboard:plot_data:{graph_id}:"
    attrs = study._storage.get_study_system_attrs(study._study_id)
    chunks = sorted((int(k[len(prefix):]), v) for k, v in attrs.items()
                    if k.startswith(prefix))
    return json.loads("".join(v for _, v in chunks))


def test_board_writes_charts_at_most_every_interval_and_only_when_changed(sqlite_url,
                                                                         monkeypatch):
    spec = spec_of({"name": "asha", "max_t": 90, "grace_period": 10, "reduction_factor": 3})
    study = open_study(spec, open_storage(sqlite_url))
    saves = []
    real = optuna_dashboard.save_plotly_graph_object
    monkeypatch.setattr(optuna_dashboard, "save_plotly_graph_object",
                        lambda s, f, graph_object_id: (saves.append(graph_object_id),
                                                       real(s, f,
                                                            graph_object_id=graph_object_id)))
    now = [100.0]
    board = StudyBoard(study, spec, min_interval_s=5.0, clock=lambda: now[0])
    board.poke()
    assert sorted(saves) == [COST_ID, RUNGS_ID]
    trial_ = study.ask()
    for step in (10, 30):
        trial_.report(0.5, step)
    now[0] = 103.0
    board.poke()  # within the interval: nothing
    assert len(saves) == 2
    now[0] = 105.0
    board.poke()  # the rungs changed, the cost did not
    assert saves[2:] == [RUNGS_ID]
    board.poke()
    assert len(saves) == 3
    figure = saved_figure(study, RUNGS_ID)
    reached = next(t for t in figure["data"] if t["name"] == "reached")
    assert reached["y"] == [1, 1, 0]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_a_pbt_study_ends_with_its_note_lineage_and_cost_charts(sqlite_url, tmp_path):
    from hpo.tune.driver import run_study

    spec = parse_spec({
        "name": "toy-pbt-charts", "task": "toy-hpo",
        # slow enough (24 x 0.2 s) that the four members train at the same time even when
        # their actors start seconds apart on a busy machine: PBT exploits only among
        # members that have reported
        "config": {"max_updates": 24, "max_epochs": None, "eval_interval": 3,
                   "micro_batch_size": 8, "sleep_ms": 200},
        "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0}},
        "objective": {"metric": "val_loss"}, "sampler": {"name": "random", "seed": 3},
        "scheduler": {"name": "pbt", "perturbation_interval": 6, "quantile_fraction": 0.5},
        "budget": {"n_trials": 4, "max_concurrent_trials": 4}, "resources": {"cpus": 0.5}})
    out = run_study(spec, sqlite_url, results_dir=tmp_path)
    study = optuna.load_study(study_name=spec.name, storage=sqlite_url)
    assert study.metric_names == ["val_loss"]
    note = optuna_dashboard.get_note(study)
    assert note.startswith("# toy-pbt-charts\n")
    assert "| `quality` | float | 0 | 10 | no |  |  |" in note.splitlines()
    assert f"Best trial: **{out.best_number}**, `val_loss` = " in note
    assert "**COMPLETED**: 4 complete, 0 pruned, 0 failed." in note
    lineage = saved_figure(study, LINEAGE_ID)
    members = [t["name"] for t in lineage["data"] if t.get("xaxis", "x") == "x"
               and t["name"].startswith("trial ")]
    assert members == [f"trial {t.number}" for t in study.trials]
    n_exploits = sum(len(t.user_attrs.get("exploits", [])) for t in study.trials)
    assert n_exploits > 0
    edges = next(t for t in lineage["data"] if t["name"] == "exploits")
    assert len(edges["x"]) == 3 * n_exploits
    cost = saved_figure(study, COST_ID)
    best = next(t for t in cost["data"] if t["name"] == "best val_loss so far")
    total = sum(t.user_attrs["device_seconds"] for t in study.trials)
    assert best["x"][-1] == pytest.approx(total, abs=1e-6)
    assert best["y"][-1] == pytest.approx(out.best_value)
