"""A create's body, already read by ``service.middleware.BodyLimit``, is parsed only after the
token is resolved, and the token, the parse and the create take one hand-over to the thread
pool, whatever the body's size and whether its length is declared. The answers come in one
order: the token's (401, 403), then the media type's (415), the body's (400), the spec's
(422), and the create's."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
import starlette.concurrency

import service.deps
from service.auth import create_token
from service.db import StudyRow
from tests.service.conftest import bearer, tiny_spec

SMALL = 64 * 1024  # a spec's usual size is under a few KiB; "large" is over this


def _body(spec: dict, size: str) -> bytes:
    """``spec`` as JSON, padded with white space past 64 KiB for ``large``."""
    text = json.dumps(spec)
    if size == "large":
        text += " " * (SMALL + 1 - len(text))
    return text.encode()


@pytest.fixture
def hand_overs(monkeypatch) -> list[str]:
    """The names of the functions the routes hand to the thread pool, in order."""
    seen: list[str] = []
    original = starlette.concurrency.run_in_threadpool

    async def counting(func, *args, **kwargs):
        seen.append(getattr(func, "__qualname__", repr(func)))
        return await original(func, *args, **kwargs)

    monkeypatch.setattr(service.deps, "run_in_threadpool", counting)
    return seen


@pytest.mark.parametrize("size", ["small", "large"])
def test_a_creates_answers_come_in_one_order_whatever_its_bodys_size(client, tokens, app, size):
    sessions = app.state.components.sessions
    viewer = create_token(sessions, "vic", role="viewer")
    good = _body(tiny_spec("ordered"), size)
    bad_spec = _body(tiny_spec("ordered", n_trials=0), size)
    malformed = b"{" + b" " * (SMALL + 1 if size == "large" else 8)
    plain = {"Content-Type": "text/plain"}
    cases = [  # (headers, body) -> (status, error code)
        ({"Authorization": "Bearer nope", **plain}, malformed, 401, "not_authenticated"),
        ({**bearer(viewer), **plain}, malformed, 403, "forbidden"),
        ({**bearer(tokens["alice"]), **plain}, good, 415, "unsupported_media_type"),
        (bearer(tokens["alice"]), malformed, 400, "malformed_body"),
        (bearer(tokens["alice"]), bad_spec, 422, "invalid_spec"),
    ]
    for headers, body, expected, code in cases:
        r = client.post("/v1/studies", content=body,
                        headers={"Content-Type": "application/json", **headers})
        assert (r.status_code, r.json()["error"]["code"]) == (expected, code), r.text
    with sessions() as session:
        assert session.execute(sa.select(StudyRow.name)).scalars().all() == []
    r = client.post("/v1/studies", content=good, headers={
        **bearer(tokens["alice"]), "Content-Type": "application/json"})
    assert r.status_code == 201 and r.json()["name"] == "ordered"


def test_a_create_takes_one_hand_over_to_the_thread_pool_whatever_its_body(
        client, tokens, hand_overs):
    h = {**bearer(tokens["alice"]), "Content-Type": "application/json"}

    def chunked():  # no Content-Length
        yield _body(tiny_spec("chunked"), "small")

    for name, content in (("small", _body(tiny_spec("small"), "small")),
                          ("large", _body(tiny_spec("large"), "large")),
                          ("chunked", chunked())):
        hand_overs.clear()
        r = client.post("/v1/studies", content=content, headers=h)
        assert r.status_code == 201 and r.json()["name"] == name
        assert len(hand_overs) == 1, hand_overs
