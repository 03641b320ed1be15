"""``hpo status`` of a study as the service answers it (the client's answer stubbed)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import hpo.cli
from service.client import Client


def _study(constraints: list, complete: int, best: list) -> dict:
    return {"name": "s", "status": "COMPLETED", "progress": {"finished": complete},
            "n_trials": 2, "counts": {"complete": complete, "pruned": 0, "failed": 0,
                                      "running": 0},
            "device_seconds": 1.0, "stop_requested": False, "error": None,
            "spec": {"objective": {"metric": "val_accuracy"}, "constraints": constraints},
            "best_trials": best}


@pytest.mark.parametrize(("constraints", "complete", "best", "says"), [
    # the breaker: an all-infeasible study's status showed no best line and no reason
    ([{"metric": "peak_memory_bytes", "max": 1}], 2, [], True),
    ([{"metric": "peak_memory_bytes", "max": 1}], 0, [], False),  # none complete yet
    ([], 2, [{"number": 1, "values": [0.9], "params": {"lr": 0.1}}], False),
])
def test_status_says_why_a_study_with_constraints_has_no_best_trial(
        monkeypatch, constraints, complete, best, says):
    monkeypatch.setattr(Client, "study", lambda self, name: _study(constraints, complete, best))
    result = CliRunner().invoke(hpo.cli.app, ["status", "s"], env={"HPO_TOKEN": "hpo_x"})
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # whatever the terminal's width wrapped
    assert ("best none: every complete trial breaks a constraint" in output) is says
    assert ("best trial #1: val_accuracy = 0.9" in output) is bool(best)


def test_status_of_several_objectives_shows_the_pareto_front(monkeypatch):
    """The breaker: each member of the front was printed as ``best trial #N``."""
    study = _study([], 2, [{"number": 0, "values": [0.9, 0.3], "params": {"lr": 0.1}},
                           {"number": 1, "values": [0.8, 0.2], "params": {"lr": 0.2}}])
    study["spec"]["objective"] = [{"metric": "val_accuracy"}, {"metric": "val_loss"}]
    monkeypatch.setattr(Client, "study", lambda self, name: study)
    result = CliRunner().invoke(hpo.cli.app, ["status", "s"], env={"HPO_TOKEN": "hpo_x"})
    assert result.exit_code == 0, result.output
    lines = [line.strip() for line in result.output.splitlines() if line.strip()]
    assert lines[lines.index("Pareto front: 2 trial(s)"):] == [
        "Pareto front: 2 trial(s)", "#0: val_accuracy = 0.9, val_loss = 0.3", "lr = 0.1",
        "#1: val_accuracy = 0.8, val_loss = 0.2", "lr = 0.2"]
    assert "best trial" not in result.output


HOSTILE_NAMES = ["zzz/../victim", "victim?x=1", "victim#frag", "..", ".", "", "a b", "-x",
                 "%2e%2e", "victim/stop", "v\r\nX-Injected: 1", "é", "a" * 65]
NAME_COMMANDS = [["status"], ["trials"], ["stop"], ["best"], ["model"],
                 ["model", "--trial", "3"]]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("command", NAME_COMMANDS, ids=" ".join)
def test_a_name_no_study_can_have_is_refused_before_any_request(monkeypatch, command, name):
    """The breaker: ``hpo status 'zzz/../victim'`` printed study ``victim`` (the client put
    the NAME into the URL as it came, and ``..`` was resolved), and ``hpo stop`` would
    have stopped it."""
    sent = []
    monkeypatch.setattr(Client, "call", lambda self, *a, **k: sent.append(a))
    monkeypatch.setattr("httpx.Client.send", lambda self, request, **k: sent.append(request))
    result = CliRunner().invoke(hpo.cli.app, [*command[:1], "--", name, *command[1:]],
                                env={"HPO_TOKEN": "hpo_x", "COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert "NAME" in result.output and "is no study name" in " ".join(result.output.split())
    assert sent == []


@pytest.mark.parametrize("name", ["s", "A.b-c_9", "9" * 64])
def test_a_study_name_reaches_exactly_its_own_routes(name):
    from service.client import study_path

    assert study_path(name) == f"/v1/studies/{name}"
    assert study_path(name, "trials", "3", "model") == f"/v1/studies/{name}/trials/3/model"
    for bad in HOSTILE_NAMES:
        with pytest.raises(ValueError, match="is no study name"):
            study_path(bad)


def test_a_refused_query_parameter_is_named_as_the_commands_option(monkeypatch):
    """The breaker: ``hpo list --status BOGUS`` named ``query.status``."""
    from service.client import ApiError

    def refuse(self, status, offset, limit):
        raise ApiError(422, "invalid_request", "invalid request",
                       [{"loc": "query.status", "msg": "Input should be 'QUEUED', ..."}])

    monkeypatch.setattr(Client, "studies", refuse)
    result = CliRunner().invoke(hpo.cli.app, ["list", "--status", "BOGUS"],
                                env={"HPO_TOKEN": "hpo_x", "COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert "  --status: Input should be 'QUEUED', ..." in result.output
    assert "query.status" not in result.output


@pytest.mark.parametrize("port", ["-1", "65536", "99999"])
def test_serve_names_the_port_flag_for_a_port_out_of_range(port):
    """The breaker: ``hpo serve --port 99999`` named HPO_PORT, not the flag given."""
    result = CliRunner().invoke(hpo.cli.app, ["serve", "--port", port],
                                env={"COLUMNS": "1000"})
    assert result.exit_code == 2, result.output
    assert "--port" in result.output and "HPO_PORT must" not in result.output


HOSTILE_TEXT = ["[/]", "[b]x[/b]", ":smile:", "a:b:c", "[link=x]y"]  # short: no cell wraps


@pytest.mark.parametrize("text", HOSTILE_TEXT)
@pytest.mark.parametrize("command", ["status", "best", "trials"])
def test_users_text_is_printed_as_it_is_never_as_markup_or_emoji(monkeypatch, command, text):
    """helper-32: a categorical choice or a failure's reason with ``[/]`` crashed ``hpo
    status``, ``best`` and ``trials`` (rich's MarkupError), other brackets vanished, and
    ``:smile:`` became an emoji."""
    study = {**_study([], 1, [{"number": 0, "values": [0.5], "params": {"tag": text}}]),
             "status": "FAILED", "error": f"the driver failed: {text}"}
    page = {"total": 1, "items": [{"number": 0, "state": "FAIL", "value": None,
                                   "params": {"tag": text},
                                   "user_attrs": {"fail_reason": f"ValueError: {text}"}}]}
    monkeypatch.setattr(Client, "study", lambda self, name: study)
    monkeypatch.setattr(Client, "trials", lambda self, name, offset, limit: page)
    result = CliRunner().invoke(hpo.cli.app, [command, "s"],
                                env={"HPO_TOKEN": "hpo_x", "COLUMNS": "1000"})
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    shown = {"status": f"the driver failed: {text}", "best": f"tag = {text!r}",
             "trials": f"tag={text}"}[command]
    assert shown in result.output
    if command == "trials":
        assert f"ValueError: {text}" in result.output


@pytest.mark.parametrize(("objective", "best", "says"), [
    ({"metric": "val_accuracy"}, [{"values": [0.97213]}], "best 0.9721"),
    ({"metric": "val_accuracy"}, [], "best -"),
    ([{"metric": "val_accuracy"}, {"metric": "val_loss"}],
     [{"values": [0.9, 0.3]}, {"values": [0.8, 0.2]}], "front 2"),
    ([{"metric": "val_accuracy"}, {"metric": "val_loss"}], [], "front 0")])
def test_submit_wait_s_progress_line_names_the_front_for_several_objectives(objective, best,
                                                                           says):
    """The breaker: a multi-objective study's line showed ``best`` and the first value of
    an arbitrary member of the front."""
    from service.progress import describe

    study = _study([], 2, best)
    study["spec"]["objective"] = objective
    assert describe(study) == f"COMPLETED 0 running  0 pruned  0 failed  {says}"


def test_trials_shows_every_objective_and_which_trials_are_infeasible(monkeypatch):
    """The breaker: ``hpo trials`` showed the first objective alone, and nothing marked the
    infeasible trial with the best value."""
    page = {"total": 3, "items": [
        {"number": 0, "state": "COMPLETE", "value": 0.9, "values": [0.9, 0.25],
         "params": {"lr": 0.1}, "user_attrs": {}, "feasible": True},
        {"number": 1, "state": "COMPLETE", "value": 0.99, "values": [0.99, 0.5],
         "params": {"lr": 0.2}, "user_attrs": {}, "feasible": False},
        {"number": 2, "state": "PRUNED", "value": None, "values": None,
         "params": {"lr": 0.3}, "user_attrs": {"stopped_by": "mo-asha"}, "feasible": False}]}
    monkeypatch.setattr(Client, "trials", lambda self, name, offset, limit: page)
    result = CliRunner().invoke(hpo.cli.app, ["trials", "s"],
                                env={"HPO_TOKEN": "hpo_x", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line.replace("│", " ").split() for line in result.output.splitlines()
            if line.replace("│", " ").split()[:1] in (["0"], ["1"], ["2"])]
    assert rows == [["0", "COMPLETE", "0.9,", "0.25", "lr=0.1"],
                    ["1", "COMPLETE", "0.99,", "0.5", "lr=0.2", "infeasible"],
                    ["2", "PRUNED", "lr=0.3", "infeasible;", "stopped", "by", "mo-asha"]]


@pytest.mark.parametrize(("status", "says"), [("COMPLETED", "no complete trial"),
                                              ("RUNNING", "no complete trial yet")])
def test_status_of_a_study_without_a_complete_trial_says_so(monkeypatch, status, says):
    """The new-user walkthrough: ``submit --wait`` of a study whose only trial failed
    ended without a word on its best trial (``hpo run`` says ``no complete trial``)."""
    study = _study([], 0, [])
    study["status"] = status
    monkeypatch.setattr(Client, "study", lambda self, name: study)
    result = CliRunner().invoke(hpo.cli.app, ["status", "s"], env={"HPO_TOKEN": "hpo_x"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == says


def test_trials_marks_a_note_it_cuts():
    """The new-user walkthrough: a long failure reason was cut mid-word without a mark."""
    page = {"total": 1, "items": [
        {"number": 0, "state": "FAIL", "value": None, "values": None, "params": {},
         "user_attrs": {"fail_reason": "NonFiniteError: non-finite loss (nan) at optimizer "
                                       "update 11; the update was not applied"}}]}
    with pytest.MonkeyPatch.context() as m:
        m.setattr(Client, "trials", lambda self, name, offset, limit: page)
        result = CliRunner().invoke(hpo.cli.app, ["trials", "s"],
                                    env={"HPO_TOKEN": "hpo_x", "COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    cells = "".join(ch for ch in result.output if ch not in "│┃ \n")  # however it wraps
    assert "NonFiniteError:non-finiteloss(nan)atoptimizerupdate1…└" in cells
