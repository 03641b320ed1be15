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


def test_a_variable_set_empty_counts_as_unset():
    """``HPO_PORT=`` (a compose file's empty value, an unset shell variable) gives the
    default of every kind of setting, as pydantic-settings' ``env_ignore_empty`` says."""
    empty = {name: "" for name in ("HPO_PORT", "HPO_API_THREADS", "HPO_OPEN_READS",
                                   "HPO_HEARTBEAT_S", "HPO_RESULTS_DIR", "RAY_ADDRESS",
                                   "HPO_DATABASE_URL")}
    assert Settings.from_env(empty) == Settings.from_env({})
    assert Settings.from_env({**empty, "HPO_PORT": "9001"}).port == 9001


@pytest.mark.parametrize("env, name", [
    ({"HPO_MAX_RUNNING_STUDIES": "0"}, "HPO_MAX_RUNNING_STUDIES"),
    ({"HPO_MAX_RUNNING_STUDIES": "two"}, "HPO_MAX_RUNNING_STUDIES"),
    ({"HPO_OPEN_READS": "maybe"}, "HPO_OPEN_READS"),
    ({"HPO_PORT": "70000"}, "HPO_PORT"),
    ({"HPO_HEARTBEAT_S": "x"}, "HPO_HEARTBEAT_S"),
    ({"HPO_HEARTBEAT_S": "5", "HPO_HEARTBEAT_TIMEOUT_S": "6"}, "HPO_HEARTBEAT_TIMEOUT_S"),
    ({"HPO_RESULTS_DIR": "/srv/runs", "HPO_ARTIFACT_DIR": "/srv/runs"}, "HPO_ARTIFACT_DIR"),
    ({"HPO_RESULTS_DIR": "/srv/runs/a", "HPO_ARTIFACT_DIR": "/srv/runs/"}, "HPO_ARTIFACT_DIR"),
    ({"HPO_RESULTS_DIR": "/srv/Runs", "HPO_ARTIFACT_DIR": "/srv/runs"}, "HPO_ARTIFACT_DIR"),
])
def test_bad_values_name_the_variable(env, name):
    with pytest.raises(SettingsError, match=name):
        Settings.from_env(env)


@pytest.mark.parametrize("variable, value, message", [
    ("HPO_PORT", "70000", "HPO_PORT must be in [0, 65535], got 70000"),
    ("HPO_MAX_RUNNING_STUDIES", "0", "HPO_MAX_RUNNING_STUDIES must be in [1, 1024], got 0"),
    # an open end (gt) and a closed one (le)
    ("HPO_DASHBOARD_SESSION_HOURS", "9000",
     "HPO_DASHBOARD_SESSION_HOURS must be in (0, 8760], got 9000"),
    ("HPO_DASHBOARD_SESSION_HOURS", "0",
     "HPO_DASHBOARD_SESSION_HOURS must be in (0, 8760], got 0"),
    ("HPO_DASHBOARD_SESSION_HOURS", "-1",
     "HPO_DASHBOARD_SESSION_HOURS must be in (0, 8760], got -1"),
])
def test_a_value_out_of_range_names_the_fields_interval(variable, value, message):
    """Every bound as the field has it: ``[`` for ``ge``, ``(`` for ``gt`` (a message once
    gave ``[None, 8760]`` for a field bounded by ``gt``)."""
    with pytest.raises(SettingsError) as info:
        Settings.from_env({variable: value})
    assert str(info.value) == message


def test_every_bounded_setting_names_both_ends():
    from service.settings import _interval

    for name, field in Settings.model_fields.items():
        if any(hasattr(m, k) for m in field.metadata for k in ("ge", "gt", "le", "lt")):
            assert "None" not in _interval(field.metadata), name


def _readme_settings() -> dict[str, str]:
    """``{variable: default cell}`` of the README's settings table."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("| variable | default | meaning |", 1)[1].split("\n\n", 1)[0]
    out = {}
    for line in table.splitlines()[2:]:
        names, defaults = (cell.strip() for cell in line.strip("|").split(" | ")[:2])
        names = [n.strip("` ") for n in names.split(",")]
        cells = [d.strip() for d in defaults.split(", ")] if len(names) > 1 else [defaults]
        out.update(zip(names, cells, strict=True))
    return out


def test_the_readme_table_lists_every_setting_with_its_default():
    """Issue 14.3: the README's settings table and the Settings model agree."""
    from service.settings import variables

    readme, model = _readme_settings(), variables()
    assert sorted(readme) == sorted(model)
    for name, default in model.items():
        cell = readme[name]
        if default is None:  # unset: the README says what happens then
            assert cell, name
        elif isinstance(default, bool):
            assert cell == f"`{str(default).lower()}`", (name, cell)
        elif isinstance(default, int | float):
            assert float(cell.strip("`")) == default, (name, cell)
        else:
            assert cell == f"`{default}`", (name, cell)


def test_settings_made_in_code_ignore_the_environment(monkeypatch):
    monkeypatch.setenv("HPO_PORT", "9999")
    assert Settings().port == 8000  # only from_env reads the environment
    assert Settings.from_env().port == 9999
    assert Settings(port=1).replace(port=2).port == 2
    with pytest.raises(SettingsError, match="HPO_PORT"):
        Settings().replace(port=-1)
