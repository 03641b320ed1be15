"""Warm start: explicit points and the best trials of earlier studies are evaluated first."""

from __future__ import annotations

import optuna
import pytest

from hpo.errors import SpecError
from hpo.spec import parse_spec
from hpo.tune.driver import run_study
from tests.hpo.test_driver import toy_spec


def _trials(name: str, url: str):
    return sorted(optuna.load_study(study_name=name, storage=url).trials, key=lambda t: t.number)


@pytest.mark.usefixtures("ray_session")
def test_points_and_earlier_studies_are_tried_first(sqlite_url, tmp_path):
    run_study(toy_spec("earlier", budget={"n_trials": 4}), sqlite_url, results_dir=tmp_path)
    earlier = _trials("earlier", sqlite_url)
    best_two = sorted(earlier, key=lambda t: t.value)[:2]

    spec = toy_spec("warm", budget={"n_trials": 5, "max_concurrent_trials": 1}, warm_start=[
        {"params": {"quality": 0.25}}, {"study": "earlier", "top_k": 2}])
    run_study(spec, sqlite_url, results_dir=tmp_path)
    trials = _trials("warm", sqlite_url)
    assert len(trials) == 5
    assert trials[0].params == {"quality": 0.25}
    assert trials[0].user_attrs["warm_start"] == "points[0]"
    for t, source in zip(trials[1:3], best_two, strict=True):
        assert t.params == source.params
        assert t.user_attrs["warm_start"] == f"study:earlier#{source.number}"
    assert "warm_start" not in trials[3].user_attrs  # then the sampler takes over
    study = optuna.load_study(study_name="warm", storage=sqlite_url)
    assert study.user_attrs["warm_start"] == [
        "points[0]", *(f"study:earlier#{t.number}" for t in best_two)]


def test_points_outside_the_search_space_are_refused_naming_the_field():
    base = toy_spec("x").to_dict()
    for point, loc in [({"quality": 11.0}, "warm_start.0.params.quality"),
                       ({"qualty": 1.0}, "warm_start.0.params.qualty"),
                       ({"quality": "high"}, "warm_start.0.params.quality")]:
        with pytest.raises(SpecError) as info:
            parse_spec({**base, "warm_start": [{"params": point}]})
        assert loc in [e["loc"] for e in info.value.errors]


def test_missing_or_pbt_source_study_is_refused(sqlite_url, tmp_path):
    spec = toy_spec("from-missing", warm_start=[{"study": "nope"}])
    with pytest.raises(SpecError) as info:
        run_study(spec, sqlite_url, results_dir=tmp_path)
    assert info.value.errors[0]["loc"] == "warm_start.0.study"
    pbt = toy_spec("a-pbt-study", scheduler={"name": "pbt", "perturbation_interval": 3})
    optuna.create_study(study_name="a-pbt-study", storage=sqlite_url).set_user_attr(
        "hpo_spec", pbt.to_dict())
    with pytest.raises(SpecError, match="PBT study"):
        run_study(toy_spec("from-pbt", warm_start=[{"study": "a-pbt-study"}]), sqlite_url,
                  results_dir=tmp_path)


def test_an_earlier_study_s_top_trials_are_its_feasible_ones(sqlite_url):
    # spec constraints: an infeasible trial is never among a study's best (hpo.summary),
    # so not among the top_k a later study starts from either
    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from hpo.warmstart import warm_start_points

    source = optuna.create_study(study_name="bounded", storage=sqlite_url)
    for quality, violation in [(1.0, 0.5), (2.0, -0.1), (3.0, 0.0), (4.0, -1.0)]:
        source.add_trial(create_trial(
            value=quality, params={"quality": quality},
            distributions={"quality": FloatDistribution(0.0, 10.0)},
            system_attrs={"constraints:val_loss.max": violation}))
    spec = toy_spec("warm", warm_start=[{"study": "bounded", "top_k": 2}])
    assert warm_start_points(spec, source._storage) == [
        ({"quality": 2.0}, "study:bounded#1"), ({"quality": 3.0}, "study:bounded#2")]


def test_the_enqueued_points_count_as_waiting_in_the_summary(sqlite_url):
    # a study stopped by stop_when before its warm-start points ran showed 'waiting: 0'
    # beside three WAITING trials: the enqueued trials never reached the summary
    from hpo.record import StudyRecord
    from hpo.storage import open_storage
    from hpo.summary import SummaryTracker
    from hpo.warmstart import enqueue_warm_start

    storage = open_storage(sqlite_url)
    spec = toy_spec("counted", budget={"n_trials": 4}, warm_start=[
        {"params": {"quality": 0.25}}, {"params": {"quality": 0.5}}])
    tracker = SummaryTracker(["minimize"], 1.0)
    record = StudyRecord(spec, storage, listener=tracker)
    assert enqueue_warm_start(record) == 2
    assert tracker.summary().counts.waiting == 2
    record.ask("r0")  # the first point is asked: running now, one still waiting
    counts = tracker.summary().counts
    assert (counts.waiting, counts.running) == (1, 1)
