"""Settings come from the environment once, with errors naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import SettingsError
from service.settings import Settings


def test_defaults_are_sqlite_and_a_local_ray():
    s = Settings.from_env({})
    assert s.database_url == "sqlite:///hpo.db" and s.ray_address is None
    assert s.results_dir == Path("hpo-runs") and s.max_running_studies == 2
    assert not s.open_reads and s.url == "http://127.0.0.1:8000"


def test_variables_are_read_and_overrides_win():
    env = {"HPO_DATABASE_URL": "postgresql+psycopg://u@h/db", "RAY_ADDRESS": "h:6379",
           "HPO_RESULTS_DIR": "/shared/runs", "HPO_MAX_RUNNING_STUDIES": "4",
           "HPO_OPEN_READS": "yes", "HPO_MAX_BODY_BYTES": "2048", "HPO_PORT": "9000",
           "RAY_AUTH_MODE": "token", "HPO_PUBLIC_URL": "https://hpo.example/"}
    s = Settings.from_env(env, port=9100)
    assert (s.database_url, s.ray_address, s.results_dir) == (
        "postgresql+psycopg://u@h/db", "h:6379", Path("/shared/runs"))
    assert (s.max_running_studies, s.open_reads, s.max_body_bytes, s.port) == (4, True, 2048,
                                                                               9100)
    assert s.url == "https://hpo.example"
    assert s.worker_env()["RAY_AUTH_MODE"] == "token"
    assert s.worker_env()["HPO_DATABASE_URL"] == "postgresql+psycopg://u@h/db"


@pytest.mark.parametrize("env, name", [
    ({"HPO_MAX_RUNNING_STUDIES": "0"}, "HPO_MAX_RUNNING_STUDIES"),
    ({"HPO_MAX_RUNNING_STUDIES": "two"}, "HPO_MAX_RUNNING_STUDIES"),
    ({"HPO_OPEN_READS": "maybe"}, "HPO_OPEN_READS"),
    ({"HPO_PORT": "70000"}, "HPO_PORT"),
    ({"HPO_HEARTBEAT_S": "x"}, "HPO_HEARTBEAT_S"),
    ({"HPO_HEARTBEAT_S": "5", "HPO_HEARTBEAT_TIMEOUT_S": "6"}, "HPO_HEARTBEAT_TIMEOUT_S"),
])
def test_bad_values_name_the_variable(env, name):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env(env)
