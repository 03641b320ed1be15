"""``POST /v1/studies`` with text no storage keeps: NUL, control characters and lone surrogates
in any key or string of the spec answer 422 naming the field, on SQLite and PostgreSQL, and
every error answer encodes as UTF-8 (issue 11: a lone surrogate in a key answered 500,
``resources.custom: {"a\\u0000": 1}`` was stored and failed the study later)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from service.api_errors import error_response
from service.app import create_app
from service.auth import create_token
from service.settings import Settings
from tests.service.conftest import bearer, tiny_spec

BAD_TEXT = {"nul": ("\x00", "\\x00"), "surrogate": ("\ud800", "\\ud800"),
            "low surrogate": ("\udfff", "\\udfff"), "escape": ("\x1b", "\\x1b"),
            "newline": ("\n", "\\n")}
_INT = {"type": "int", "low": 1, "high": 2}


def _cases(bad: str, shown: str) -> dict[str, tuple[dict, str]]:
    """Where a spec holds free text: (changes to the tiny spec, the loc of the answer)."""
    space = tiny_spec("x")["search_space"]
    return {
        "search-space name": ({"search_space": {**space, f"w{bad}": _INT}},
                              f"search_space.w{shown}"),
        "config key": ({"config": {bad: 1}}, f"config.{shown}"),
        "task option key": ({"config": {"max_epochs": 1, f"width{bad}": 8}},
                            f"config.width{shown}"),
        "config value": ({"config": {"max_epochs": 1, "activation": f"relu{bad}"}},
                         "config.activation"),
        "task": ({"task": f"digits{bad}"}, "task"),
        "metric": ({"objective": {"metric": f"val_loss{bad}"}}, "objective.metric"),
        "metric of several": ({"objective": [{"metric": "val_loss"}, {"metric": bad}]},
                              "objective.1.metric"),
        "choice": ({"search_space": {"activation": {"type": "categorical",
                                                    "choices": ["relu", f"gelu{bad}"]}}},
                   "search_space.activation.choices.1"),
        "custom resource": ({"resources": {"custom": {bad: 1}}}, f"resources.custom.{shown}"),
        "warm-start study": ({"warm_start": [{"study": f"s{bad}"}]}, "warm_start.0.study"),
        "warm-start parameter": ({"warm_start": [{"params": {f"lr{bad}": 0.01}}]},
                                 f"warm_start.0.params.lr{shown}"),
        "warm-start value": ({"warm_start": [{"params": {"lr": bad}}]},
                             "warm_start.0.params.lr"),
        "sampler": ({"sampler": {"name": bad}}, "sampler.name"),
        "top-level key": ({bad: 1}, shown),
        "name": ({"name": f"s{bad}"}, "name"),
    }


@pytest.fixture
def db_client(db_url, tmp_path):
    app = create_app(Settings(database_url=db_url, results_dir=tmp_path / "results",
                              run_dispatcher=False))
    token = create_token(app.state.components.sessions, "alice")
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers.update(bearer(token))
        yield client


def _post(client, spec: dict):
    # json.dumps escapes surrogates (\ud800), as any JSON client may send them
    return client.post("/v1/studies", content=json.dumps(spec),
                       headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_text_no_storage_keeps_answers_422_naming_the_field_on_every_backend(db_client, kind):
    bad, shown = BAD_TEXT[kind]
    for case, (changes, loc) in _cases(bad, shown).items():
        r = _post(db_client, {**tiny_spec("s1"), **changes})
        assert r.status_code == 422, (case, r.text)
        body = r.json()["error"]
        assert body["code"] == "invalid_spec"
        assert [d["loc"] for d in body["details"]] == [loc], case
        assert f"U+{ord(bad):04X}" in body["details"][0]["msg"], case
    assert db_client.get("/v1/studies").json()["total"] == 0
    assert _post(db_client, tiny_spec("s1")).status_code == 201  # the same spec, clean


@pytest.mark.parametrize("name", ["a b", "x" * 65, "caf\u00e9", "a,b", "a=b", "", "{a}"])
def test_a_custom_resource_name_outside_the_pattern_answers_422(db_client, name):
    r = _post(db_client, tiny_spec("s1", resources={"custom": {name: 1}}))
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["error"]["details"]] == ["resources.custom"]


def test_every_error_answer_encodes_whatever_text_it_quotes():
    r = error_response(422, "invalid_spec", "bad \ud800\x00",
                       [{"loc": "config.\ud800", "msg": "m\udfff\n"}])
    assert json.loads(r.body) == {"error": {"code": "invalid_spec", "message": "bad \\ud800\\x00",
                                            "details": [{"loc": "config.\\ud800",
                                                         "msg": "m\\udfff\\n"}]}}
