"""The Optuna study of a spec (``hpo.study``): a new one made in one transaction, a taken
name refused."""

from __future__ import annotations

import optuna
import pytest
from optuna.study import StudyDirection

from hpo.errors import StudyExistsError
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.study import SPEC_ATTR, create_study


def _spec(name: str, **changes):
    return parse_spec({
        "name": name, "task": "toy-hpo", "config": {"max_updates": 4, "max_epochs": None},
        "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "objective": [{"metric": "val_loss"}, {"metric": "val_score",
                                                "direction": "maximize"}],
        "budget": {"n_trials": 3}, **changes})


def test_create_study_stores_directions_spec_and_metric_names(db_url, unique_name):
    storage = open_storage(db_url)
    spec = _spec(unique_name)
    study_id = create_study(spec, storage)
    study = optuna.load_study(study_name=unique_name, storage=storage)
    assert study_id == storage.get_study_id_from_name(unique_name)
    assert study.directions == [StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE]
    assert study.user_attrs == {SPEC_ATTR: spec.to_dict()}
    assert study.metric_names == ["val_loss", "val_score"]
    assert study.trials == []


def test_create_study_of_a_taken_name_raises_and_leaves_that_study(db_url, unique_name):
    storage = open_storage(db_url)
    first = _spec(unique_name)
    create_study(first, storage)
    with pytest.raises(StudyExistsError, match="exists already"):
        create_study(_spec(unique_name, budget={"n_trials": 9}), storage)
    study = optuna.load_study(study_name=unique_name, storage=storage)
    assert study.user_attrs == {SPEC_ATTR: first.to_dict()}
    assert study.metric_names == ["val_loss", "val_score"]
    assert len(study.directions) == 2


@pytest.mark.parametrize(("stored", "given", "runs"), [
    (10, None, 10),  # stored when Optuna's 10 was the default: the same file goes on with 10
    (None, None, 4),  # stored unset: the budget's default (3 trials: 4)
    (10, 10, 10), (6, None, 6)])
def test_a_file_that_leaves_the_start_up_trials_unset_runs_the_stored_studys(
        db_url, unique_name, stored, given, runs):
    from hpo.space import distributions
    from hpo.study import open_stored_study

    storage = open_storage(db_url)
    tpe = {"name": "tpe", "seed": 5}
    open_stored_study(_spec(unique_name, sampler={**tpe, "n_startup_trials": stored}), storage)
    study, spec = open_stored_study(
        _spec(unique_name, sampler={**tpe, "n_startup_trials": given}), storage)
    assert spec.sampler.startup_trials(spec.budget.n_trials) == runs
    assert study.user_attrs[SPEC_ATTR]["sampler"]["n_startup_trials"] == stored
    # what runs: the first ``runs`` suggestions are the seeded random sampler's
    random = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5),
                                 directions=["minimize", "maximize"])
    for made in (study, random):
        for _ in range(runs + 1):
            trial = made.ask(distributions(spec))
            made.tell(trial, [trial.params["lr"], trial.params["lr"]])
    params = [[t.params for t in s.trials] for s in (study, random)]
    assert params[0][:runs] == params[1][:runs] and params[0][runs] != params[1][runs]


def test_a_file_that_names_other_start_up_trials_than_the_stored_study_is_refused(
        db_url, unique_name):
    from hpo.study import open_stored_study

    storage = open_storage(db_url)
    open_stored_study(_spec(unique_name, sampler={"name": "tpe", "n_startup_trials": 10}),
                      storage)
    with pytest.raises(StudyExistsError, match=r"\(sampler differ\)"):
        open_stored_study(_spec(unique_name, sampler={"name": "tpe", "n_startup_trials": 4}),
                          storage)


@pytest.mark.parametrize(("stored", "given", "joint"), [
    (True, None, True),  # stored when the multivariate TPE was the default: it goes on so
    (None, None, False),  # stored unset: the independent TPE
    (False, None, False), (True, True, True)])
def test_a_file_that_leaves_multivariate_unset_runs_the_stored_studys(
        db_url, unique_name, stored, given, joint):
    from hpo.space import distributions
    from hpo.study import open_stored_study

    storage = open_storage(db_url)
    tpe = {"name": "tpe", "seed": 5, "n_startup_trials": 1}
    open_stored_study(_spec(unique_name, sampler={**tpe, "multivariate": stored}), storage)
    study, spec = open_stored_study(
        _spec(unique_name, sampler={**tpe, "multivariate": given}), storage)
    assert spec.sampler.is_multivariate is joint
    assert study.user_attrs[SPEC_ATTR]["sampler"]["multivariate"] == stored
    # what runs: a joint model has the parameters seen so far as its search space
    trial = study.ask(distributions(spec))
    study.tell(trial, [0.5, 0.5])
    relative = study.sampler.infer_relative_search_space(study, study.trials[0])
    assert sorted(relative) == (["lr"] if joint else [])


@pytest.mark.parametrize(("stored", "given"), [(True, False), (None, True), (False, True)])
def test_a_file_that_names_another_multivariate_than_the_stored_study_is_refused(
        db_url, unique_name, stored, given):
    from hpo.study import open_stored_study

    storage = open_storage(db_url)
    open_stored_study(_spec(unique_name, sampler={"name": "tpe", "multivariate": stored}),
                      storage)
    with pytest.raises(StudyExistsError, match=r"\(sampler differ\)"):
        open_stored_study(_spec(unique_name, sampler={"name": "tpe", "multivariate": given}),
                          storage)


@pytest.mark.parametrize("sampler", [
    {"multivariate": False},  # the default, written out
    {"n_startup_trials": 4},  # the budget's (3 trials: 4), written out
    {"multivariate": False, "n_startup_trials": 4}])
def test_a_file_that_writes_out_the_default_a_stored_study_left_unset_is_the_same_study(
        db_url, unique_name, sampler):
    from hpo.study import open_stored_study

    storage = open_storage(db_url)
    open_stored_study(_spec(unique_name, sampler={"name": "tpe"}), storage)
    study, spec = open_stored_study(_spec(unique_name, sampler={"name": "tpe", **sampler}),
                                    storage)
    assert not spec.sampler.is_multivariate
    assert spec.sampler.startup_trials(spec.budget.n_trials) == 4
    assert study.user_attrs[SPEC_ATTR]["sampler"]["multivariate"] is None
    # and the other way round: stored written out, the file leaving it unset
    other = f"{unique_name}-b"
    open_stored_study(_spec(other, sampler={"name": "tpe", **sampler}), storage)
    open_stored_study(_spec(other, sampler={"name": "tpe"}), storage)
