"""Logs (issue 14.4): HPO_LOG_FORMAT=json writes JSON lines carrying the request id, study
and trial; tokens never appear in logs, whichever logger writes them."""

from __future__ import annotations

import io
import json
import logging
from urllib.parse import unquote

import pytest

from service import logs
from service.errors import SettingsError
from service.settings import Settings
from tests.service.conftest import bearer


@pytest.fixture
def captured():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.getLogRecordFactory())
    logs.configure("json", stream=stream)
    yield stream
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    logging.setLogRecordFactory(saved[2])
    logs._bound.clear()


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_request_s_log_lines_carry_its_id_and_no_token(client, tokens, captured):
    token = tokens["alice"]
    logging.getLogger("service.test").info("seen %s and Bearer %s", f"?token={token}", token)
    answer = client.get("/v1/studies", headers={**bearer(token), "X-Request-ID": "req-42"})
    assert answer.status_code == 200
    assert answer.headers["x-request-id"] == "req-42"
    lines = _lines(captured)
    assert token not in captured.getvalue()
    assert lines[0]["message"] == "seen ?token=<hidden> and Bearer <hidden>"
    assert lines[0]["level"] == "INFO" and lines[0]["logger"] == "service.test"
    assert "request_id" not in lines[0]


def test_a_log_line_written_while_serving_carries_the_request_id(app, tokens, captured):
    from fastapi.testclient import TestClient

    @app.get("/v1/_log_probe", include_in_schema=False)
    def probe():
        logging.getLogger("service.probe").warning("in the request")
        return {}

    app.router.routes.insert(0, app.router.routes.pop())  # before the catch-all /v1 route
    with TestClient(app) as client:
        answer = client.get("/v1/_log_probe", headers={"X-Request-ID": "bad id with spaces"})
    rid = answer.headers["x-request-id"]
    assert len(rid) == 32 and rid != "bad id with spaces"  # a malformed id is replaced
    probe_lines = [line for line in _lines(captured) if line["logger"] == "service.probe"]
    assert [(p["message"], p["request_id"]) for p in probe_lines] == [("in the request", rid)]


@pytest.mark.parametrize("given", ["{token}", "x-{token}", "{token_upper}"])
def test_a_token_sent_as_the_request_id_is_neither_logged_nor_echoed(app, tokens, captured,
                                                                     given):
    """A breaker: ``X-Request-ID: hpo_...`` (well-formed as an id) was kept as the request's
    id, so the token was written unredacted into every log line of the request
    (``[request_id=hpo_...]``) and echoed in the answer. Such an id is replaced."""
    from fastapi.testclient import TestClient

    token = tokens["alice"]
    given = given.format(token=token, token_upper=token.upper())
    with TestClient(app) as client:
        answer = client.get("/v1/studies", headers={**bearer(token), "X-Request-ID": given})
        logging.getLogger("service.probe").warning("during", extra={"study": f"s {token}"})
    assert answer.status_code == 200
    rid = answer.headers["x-request-id"]
    assert len(rid) == 32 and rid != given
    assert token not in captured.getvalue() and token.upper() not in captured.getvalue()
    [probe] = [line for line in _lines(captured) if line["logger"] == "service.probe"]
    assert probe["study"] == "s <hidden>"


def test_study_and_trial_context(captured):
    logs.bind(study="digits-1")
    logging.getLogger("hpo.record").info("trial ended", extra={"trial": 7})
    try:
        raise ValueError("boom hpo_abcdefghijklmnopqrstuvwxyz")
    except ValueError:
        logging.getLogger("service.worker").exception("study failed")
    first, second = _lines(captured)
    assert (first["study"], first["trial"], first["message"]) == ("digits-1", 7, "trial ended")
    assert second["study"] == "digits-1" and "trial" not in second
    assert "ValueError: boom hpo_<hidden>" not in second["exc"]  # the prefix goes with it
    assert "ValueError: boom <hidden>" in second["exc"]


def test_text_format_shows_the_context_in_brackets():
    stream = io.StringIO()
    root = logging.getLogger()
    saved = list(root.handlers)
    try:
        logs.configure("text", stream=stream)
        logging.getLogger("hpo.x").warning("Authorization: Bearer abc.def", extra={"trial": 3})
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
    line = stream.getvalue().strip()
    assert line.endswith("WARNING hpo.x: Authorization: Bearer <hidden> [trial=3]"), line


def test_log_format_setting_names_the_variable():
    assert Settings.from_env({"HPO_LOG_FORMAT": "JSON"}).log_format == "json"
    assert Settings.from_env({}).log_format == "text"
    with pytest.raises(SettingsError, match="HPO_LOG_FORMAT must be one of text, json, got 'xml'"):
        Settings.from_env({"HPO_LOG_FORMAT": "xml"})


def test_a_trial_s_end_is_logged_with_its_study_and_number(captured, tmp_path):
    """The record's log line at a trial's end carries the trial number (issue 14.4)."""
    import optuna

    from hpo.record import StudyRecord
    from hpo.spec import parse_spec
    from hpo.storage import open_storage
    from tests.service.conftest import tiny_spec

    spec = parse_spec(tiny_spec("logged", n_trials=1))
    record = StudyRecord(spec, open_storage(f"sqlite:///{tmp_path / 'o.db'}"))
    record.ask("ray-1")
    record.started("ray-1")
    record.result("ray-1", {"val_accuracy": 0.5, "updates": 1, "stop_reason": "max_updates"})
    record.complete_or_prune("ray-1", "scheduler")
    ended = [line for line in _lines(captured) if line["logger"] == "hpo.record"]
    assert [(e["message"], e["study"], e["trial"]) for e in ended] == [
        ("trial 0 ended COMPLETE", "logged", 0)]
    assert optuna.load_study(study_name="logged", storage=record.storage).trials[0].state.name \
        == "COMPLETE"


@pytest.mark.parametrize("text", [
    "GET /v1/studies?x=Bearer%20{t}", "?q=%22{t}", "?token%3D{t}", "x_{t}", "a{t}",
    "/v1/studies/hpo%5F{rest}", "Authorization: bearer {t}", "Bearer+{t}"])
def test_tokens_are_hidden_however_they_are_written(text):
    token = "hpo_" + "Ab3_-" * 9  # the shape of hpo token create's tokens
    line = logs.redact(text.format(t=token, rest=token[4:]))
    assert token[4:] not in line and "<hidden>" in line, line


def _escaped(text: str) -> str:
    return "".join(f"%{b:02X}" for b in text.encode())


@pytest.mark.parametrize("form", [
    lambda t: "%68" + t[1:],  # its first letter escaped
    lambda t: t[:9] + "%2D" + t[10:],  # a letter in the middle
    _escaped,  # every character
    lambda t: "%2568" + t[1:],  # an escape of an escape
    lambda t: t[:4] + _escaped(t[4:12]) + t[12:],
])
def test_tokens_written_with_percent_escapes_are_hidden(form):
    # the access log holds the request line as the client wrote it: ?k=%68po_... kept the
    # whole token
    token = "hpo_" + "Ab3_-" * 9
    line = logs.redact(f'"GET /healthz?k={form(token)} HTTP/1.1" 200')
    for _ in range(3):
        line = unquote(line)
    assert token[4:] not in line and "<hidden>" in line, line


@pytest.mark.parametrize(("line", "logged"), [
    # found by the breaker: any token= made the whole line decoded, so %0A forged a second
    # log line and %1B reached the terminal
    ('"GET /readyz?token=x&n=%0A2026-12-06 INFO forged%1b[2J HTTP/1.1" 200',
     '"GET /readyz?token=<hidden>&n=%0A2026-12-06 INFO forged%1b[2J HTTP/1.1" 200'),
    ('"GET /x?k=%68po_{rest}&n=%0Aforged%1B[2J%E2%80%A8 HTTP/1.1" 200',
     '"GET /x?k=<hidden>&n=%0Aforged%1B[2J%E2%80%A8 HTTP/1.1" 200'),
    ('"GET /v1/a%2Fb HTTP/1.1" Bearer {t}', '"GET /v1/a%2Fb HTTP/1.1" Bearer <hidden>'),
])
def test_a_decoded_line_stays_one_line_without_control_characters(line, logged):
    token = "hpo_" + "Ab3_-" * 9
    assert logs.redact(line.format(t=token, rest=token[4:])) == logged


def test_a_line_without_a_secret_keeps_its_escapes():
    line = '"GET /v1/studies?owner=a%20b&q=%68po_short HTTP/1.1" 200'
    assert logs.redact(line) == line


def test_text_tracebacks_hide_tokens_too():
    stream = io.StringIO()
    root = logging.getLogger()
    saved, factory = list(root.handlers), logging.getLogRecordFactory()
    token = "hpo_" + "x" * 43
    try:
        logs.configure("text", stream=stream)
        try:
            raise ValueError(f"Bearer {token}")
        except ValueError:
            logging.getLogger("service.x").exception("failed")
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved:
            root.addHandler(handler)
        logging.setLogRecordFactory(factory)
    assert "ValueError: Bearer <hidden>" in stream.getvalue()
    assert token not in stream.getvalue()


def test_loggers_with_handlers_of_their_own_hide_secrets_too(captured):
    """helper-32: Ray's ``ray`` logger has its own handler and does not propagate, so the
    root's filter never saw Ray Tune's 'Trial task failed' traceback, which carried the
    trial's error text with a service token and a bearer credential."""
    token = "hpo_" + "y" * 43
    own = io.StringIO()
    logger = logging.getLogger("ray.tune.test_own_handler")
    handler = logging.StreamHandler(own)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise RuntimeError(f"password=hunter2 token {token} Bearer sk-live-XYZ")
        except RuntimeError as e:
            logger.error("Trial task failed: %s", e, exc_info=True)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    text = own.getvalue()
    assert text.startswith("ERROR ray.tune.test_own_handler: Trial task failed: "
                           "password=<hidden> token <hidden> Bearer <hidden>\n")
    assert "RuntimeError: password=<hidden>" in text
    for secret in (token, "hunter2", "sk-live-XYZ"):
        assert secret not in text

