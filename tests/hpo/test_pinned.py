"""The pinned library versions that guard the modules using private names."""

from __future__ import annotations

import optuna
import pytest

from hpo import storage
from hpo.pinned import require


def test_another_version_refuses_the_import_naming_both():
    with pytest.raises(ImportError) as info:
        require("Optuna", "5.1.0", "5.0.0", "hpo.storage")
    assert str(info.value) == (
        "hpo.storage was written against Optuna 5.0.0, found 5.1.0: check its private names "
        "against the new Optuna, then update the pinned version there")
    require("Optuna", "5.0.0", "5.0.0", "hpo.storage")  # the pinned one imports


def test_the_storage_module_is_pinned_to_the_installed_optuna():
    assert storage.OPTUNA_VERSION == optuna.__version__ == "5.0.0"


def test_the_dashboard_cache_module_is_pinned_to_the_installed_optuna_dashboard():
    import optuna_dashboard

    from service import dashboard_cache

    assert dashboard_cache.DASHBOARD_VERSION == optuna_dashboard.__version__ == "0.21.0"
