"""Every service command refuses a bad HPO_DATABASE_URL or RAY_ADDRESS alike: one line
naming the variable, exit 2, no traceback (an operations tester's findings: ``hpo db
current`` ended in a 61-line traceback, an in-memory SQLite URL in a TypeError of
``create_engine`` for every command)."""

from __future__ import annotations

import logging

import pytest
from typer.testing import CliRunner

from hpo.cli import app as hpo_app

COMMANDS = [["db", "current"], ["db", "upgrade"], ["serve"], ["token", "create", "x"]]
NOT_A_URL = ("error: HPO_DATABASE_URL is not a database URL (e.g. sqlite:///hpo.db or "
             "postgresql+psycopg://USER:PASSWORD@HOST:5432/DB), got {!r}")
IN_MEMORY = ("error: HPO_DATABASE_URL names an in-memory SQLite database, which every process "
             "of the service would see empty: name a file, e.g. sqlite:///hpo.db; got {!r}")


def _run(argv: list[str], env: dict[str, str], monkeypatch) -> tuple[int, str]:
    monkeypatch.setenv("HPO_PORT", "0")  # serve binds its port first: any free one will do
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    result = CliRunner().invoke(hpo_app, argv)
    return result.exit_code, result.output


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("url, expected", [
    ("nonsense", NOT_A_URL.format("nonsense")), (" ", NOT_A_URL.format(" ")),
    ("sqlite://", IN_MEMORY.format("sqlite://")), ("sqlite:///", IN_MEMORY.format("sqlite:///")),
    ("sqlite:///:memory:", IN_MEMORY.format("sqlite:///:memory:")),
    ("postgresql+psycopg://postgres:p@ss/w#rd@127.0.0.1:5432/brk_ops",
     "error: HPO_DATABASE_URL holds more than one '@': write an '@' of the user or password "
     "as %40 (and a '%' as %25)"),
])
def test_every_service_command_refuses_a_bad_database_url_in_one_line(argv, url, expected,
                                                                     monkeypatch):
    code, output = _run(argv, {"HPO_DATABASE_URL": url}, monkeypatch)
    assert (code, output) == (2, expected + "\n")


def _never_listen(monkeypatch) -> None:
    from service import server

    def never(*_args, **_kwargs):
        raise AssertionError("serve went on with settings it should have refused")

    monkeypatch.setattr(server, "listen", never)


def test_serve_refuses_a_malformed_ray_address_before_it_starts(monkeypatch):
    _never_listen(monkeypatch)
    code, output = _run(["serve"], {"RAY_ADDRESS": "not a ray address"}, monkeypatch)
    assert (code, output) == (2, "error: RAY_ADDRESS must be auto, HOST:PORT or "
                                 "ray://HOST:PORT (e.g. 10.0.0.1:6379), got 'not a ray "
                                 "address'\n")


def test_serve_refuses_a_public_url_without_a_scheme(monkeypatch):
    _never_listen(monkeypatch)
    code, output = _run(["serve"], {"HPO_PUBLIC_URL": "localhost:8011"}, monkeypatch)
    assert (code, output) == (2, "error: HPO_PUBLIC_URL must be an http:// or https:// "
                                 "address with a host (e.g. https://hpo.example.com or "
                                 "http://10.0.0.5:8000), got 'localhost:8011'\n")


def test_serve_on_every_interface_without_a_public_url_warns_to_set_it(tmp_path, monkeypatch,
                                                                      caplog):
    from service import logs, server

    served = []
    monkeypatch.setattr(logs, "configure", lambda *_args, **_kwargs: None)  # caplog's handler
    monkeypatch.setattr(server, "serve", lambda settings, sock: served.append(settings.url))
    env = {"HPO_HOST": "0.0.0.0", "HPO_DATABASE_URL": f"sqlite:///{tmp_path / 'hpo.db'}"}
    with caplog.at_level(logging.WARNING, logger="service.cli"):
        code, output = _run(["serve"], env, monkeypatch)
    assert code == 0, output
    assert served == ["http://127.0.0.1:0"]  # HPO_PORT=0: the server's port comes later
    assert [r.getMessage() for r in caplog.records if r.name == "service.cli"] == [
        "HPO_HOST=0.0.0.0 listens on every interface, but without HPO_PUBLIC_URL the "
        "dashboard takes logins only from http://127.0.0.1:0 (this machine): set "
        "HPO_PUBLIC_URL to the address people open, e.g. http://HOSTNAME:0"]
