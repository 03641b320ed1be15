"""docker-compose.yml's database URL (``HPO_DATABASE_URL``, built from ``POSTGRES_PASSWORD``
by compose's interpolation, which cannot URL-encode): a password is taken as it is unless it
holds an ``@`` or a ``%``, and one with an ``@`` is refused in one line that shows none of it,
as the compose file and the README say."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest
import yaml
from sqlalchemy.engine import make_url

from service.errors import SettingsError
from service.settings import Settings

REPO = Path(__file__).resolve().parents[2]


def _database_url(password: str) -> str:
    """The head's HPO_DATABASE_URL with ``POSTGRES_PASSWORD=password`` in ``.env``."""
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    template = compose["services"]["head"]["environment"]["HPO_DATABASE_URL"]
    return re.sub(r"\$\{POSTGRES_PASSWORD(:-[^}]*)?\}", lambda _: password, template)


@pytest.mark.parametrize("char", sorted(set(string.punctuation) - {"@", "%"}))
def test_a_password_without_at_or_percent_reaches_postgres_as_it_is(char):
    password = f"pa{char}ss{char}"
    url = make_url(Settings.from_env({"HPO_DATABASE_URL": _database_url(password)})
                   .database_url)
    assert (url.password, url.host, url.port, url.database) == (password, "postgres", 5432,
                                                                "hpo")


def test_a_password_with_an_at_is_refused_showing_none_of_it():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"HPO_DATABASE_URL": _database_url("p@ss/w#rd")})
    assert str(caught.value) == ("HPO_DATABASE_URL holds more than one '@': write an '@' of "
                                 "the user or password as %40 (and a '%' as %25)")

