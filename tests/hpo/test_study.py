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
