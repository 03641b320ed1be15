"""docker-compose.yml's database password: compose's interpolation cannot URL-encode, so
``POSTGRES_PASSWORD`` reaches the service as libpq's ``PGPASSWORD`` and ``HPO_DATABASE_URL``
holds none; any character of it reaches PostgreSQL as it is, as the compose file and the
README say. A URL that holds a password with a bare ``@`` is still refused in one line that
shows none of it."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
import sqlalchemy
import yaml
from sqlalchemy.engine import make_url

from service.errors import SettingsError
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]
PASSWORDS = [f"pa{char}ss{char}" for char in string.punctuation] + ["p@ss%25/w:rd#?"]


def _head_env(password: str) -> dict[str, str]:
    """The head's HPO_DATABASE_URL and PGPASSWORD with ``POSTGRES_PASSWORD=password`` in
    ``.env`` (compose's ``${POSTGRES_PASSWORD:-hpo}``)."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    env = compose["services"]["head"]["environment"]
    return {name: re.sub(r"\$\{POSTGRES_PASSWORD(:-[^}]*)?\}", lambda _: password, env[name])
            for name in ("HPO_DATABASE_URL", "PGPASSWORD")}


@pytest.mark.parametrize("password", PASSWORDS)
def test_any_password_reaches_the_service_as_pgpassword_and_the_url_holds_none(password):
    env = _head_env(password)
    assert env["PGPASSWORD"] == password
    url = make_url(Settings.from_env(env).database_url)
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "hpo", None, "postgres", 5432, "hpo")


@pytest.mark.parametrize("password", ["p@ss%25/w:rd#?", "pa ss'\"\\"])
def test_libpq_sends_the_pgpassword_of_a_url_without_one(pg_url, monkeypatch, password):
    """What compose relies on, on the real PostgreSQL: libpq (psycopg) takes the password
    from ``PGPASSWORD`` when the URL has none, every character as it is."""
    monkeypatch.setenv("PGPASSWORD", password)
    engine = sqlalchemy.create_engine(make_url(pg_url).set(password=None))
    try:
        with engine.connect() as conn:
            assert conn.connection.driver_connection.info.password == password
    finally:
        engine.dispose()


def test_a_url_whose_password_holds_an_at_is_refused_showing_none_of_it():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"HPO_DATABASE_URL": "postgresql+psycopg://hpo:p@ss/w#rd@db/hpo"})
    assert str(caught.value) == ("HPO_DATABASE_URL holds more than one '@': write an '@' of "
                                 "the user or password as %40 (and a '%' as %25)")
