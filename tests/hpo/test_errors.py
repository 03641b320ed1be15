"""Errors of hpo: one public line about an error, without traceback or server path."""

from __future__ import annotations

import traceback

import pytest

from hpo.errors import public_message


def _chained_traceback() -> str:
    try:
        try:
            open("/srv/hpo/secret/study.db")  # noqa: SIM115 - raises
        except OSError as e:
            raise RuntimeError("while loading /srv/hpo/secret/study.db: failed") from e
    except RuntimeError:
        return traceback.format_exc()
    raise AssertionError("unreachable")


RAY_TRIAL_ERROR = """\
ray::ImplicitFunc.train() (pid=4242, ip=10.0.0.7, actor_id=ab12)
  File "/opt/hpo/.venv/lib/python3.11/site-packages/ray/tune/trainable.py", line 331, in train
    raise skipped from exception_cause(skipped)
  File "/opt/hpo/hpo/tune/trainable.py", line 88, in train_trial
    fit(task, config)
OverflowError: Python int too large to convert to C long"""

CASES = {
    "chained traceback": (_chained_traceback(), {}, "RuntimeError: while loading <path>: failed"),
    "ray trial error": (RAY_TRIAL_ERROR, {},
                        "OverflowError: Python int too large to convert to C long"),
    "wrapped ray error": ("ray.exceptions.RayTaskError(OverflowError): ray::Impl.train()\n"
                          + RAY_TRIAL_ERROR.split("\n", 1)[1], {},
                          "OverflowError: Python int too large to convert to C long"),
    "message with paths": ("OSError: cannot write /var/lib/hpo/runs/s1/trial_0/ckpt and "
                           "'~/hpo-runs/x' (3/4 done, see docs/a.md)", {},
                           "OSError: cannot write <path> and '<path>' (3/4 done, see docs/a.md)"),
    "url with password": ("StorageError: cannot reach postgresql+psycopg://hpo:s3cret@db:5432/hpo"
                          " (refused)", {}, "StorageError: cannot reach postgresql+psycopg://... "
                                            "(refused)"),
    "multi-line message": ("SpecError: budget.n_trials: too many\nsecond line /etc/x", {},
                           "SpecError: budget.n_trials: too many"),
    "log tail": ("starting\nwarm driver: ready\nKilled by /usr/bin/oom\n", {"from_end": True},
                 "Killed by <path>"),
    "log tail with a traceback": ("x\n" + _chained_traceback() + "\n", {"from_end": True},
                                  "RuntimeError: while loading <path>: failed"),
    "ray cluster address": ("ClusterError: cannot reach the Ray cluster at 10.0.0.1:6379: "
                            "nothing answers", {}, "ClusterError: cannot reach the Ray cluster "
                                                   "at 10.0.0.1:6379: nothing answers"),
    "empty": ("\n \n", {}, "no message"),
    "colours": ("\x1b[36mValueError\x1b[39m: bad /x/y", {}, "ValueError: bad <path>"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_public_message_is_one_line_without_traceback_or_path(case):
    text, options, expected = CASES[case]
    assert public_message(text, **options) == expected


def test_public_message_is_bounded():
    out = public_message("ValueError: " + "x" * 10_000, limit=100)
    assert len(out) == 100 and out.endswith("...")


def _ray_task_error(exc: BaseException, tune_failure_header: bool = False) -> str:
    """``exc`` raised in a function trainable, as Ray 2.60 renders it (``str`` of the
    ``RayTaskError``: its ``ray::`` header, with pid and node IP, in place of each
    ``Traceback`` line), optionally as Tune writes it to a trial's error file."""
    from ray.exceptions import RayTaskError

    def train():
        raise exc

    try:
        try:
            train()
        except OSError as cause:  # a chain: the trial's error is the last exception
            raise RuntimeError("trial setup failed") from cause
    except Exception as e:  # noqa: BLE001 - whatever the trial raised
        err = RayTaskError("ImplicitFunc.train", traceback.format_exc(), e,
                           proctitle="ray::ImplicitFunc.train()", pid=4242, ip="10.1.2.3",
                           actor_repr="func", actor_id="a1b2c3")
        text = str(err)
    assert "ray::ImplicitFunc.train()" in text and "ip=10.1.2.3" in text
    return ("Failure # 1 (occurred at 2026-12-01_03-00-00)\n" + text if tune_failure_header
            else text)


FAKE_TRACEBACK = 'bad at /x\nTraceback (most recent call last):\n  File "/opt/y.py", line 3'
RAY_RENDERED = {
    "message holding a traceback": (ValueError(FAKE_TRACEBACK), "ValueError: bad at <path>"),
    "message holding a traceback and an exception line": (
        ValueError(FAKE_TRACEBACK + "\nKeyError: 'k'"), "ValueError: bad at <path>"),
    "multi-line message": (KeyError("a\nb"), "KeyError: 'a\\nb'"),
    "two-line message": (TypeError("first line\nsecond line at /srv/z"),
                         "TypeError: first line"),
    "chained": (FileNotFoundError(2, "No such file", "/srv/data"),
                "RuntimeError: trial setup failed"),
}


@pytest.mark.parametrize("tune_header", [False, True])
@pytest.mark.parametrize("case", sorted(RAY_RENDERED))
def test_public_message_of_a_ray_task_error_is_the_trials_exception_not_rays_header(
        case, tune_header):
    exc, expected = RAY_RENDERED[case]
    assert public_message(_ray_task_error(exc, tune_header)) == expected


@pytest.mark.parametrize("text", [
    "ray::ImplicitFunc.train() (pid=4242, ip=10.1.2.3, actor_id=a1b2c3)\nValueError: x",
    "\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=1, ip=10.1.2.3)\n  File \"/a.py\", line 1"
    "\n    x()\nValueError: x\nray::ImplicitFunc.train() (pid=1, ip=10.1.2.3)\n  File \"/b\"",
])
def test_public_message_never_answers_rays_header_line(text):
    assert public_message(text) == "ValueError: x"


def test_a_dead_workers_failure_says_what_happened_not_tunes_header():
    """helper-32: a trial whose worker process died (os._exit, an OOM kill) had the
    fail_reason 'Failure # 1 (occurred at ...)', Tune's header line of its error file."""
    text = ("Failure # 1 (occurred at 2026-12-07_14-32-06)\n"
            "The actor died unexpectedly before finishing this task.\n"
            "\tclass_name: ImplicitFunc\n\tpid: 4242\n"
            "The actor is dead because its worker process has died. Worker exit type: "
            "SYSTEM_ERROR\n")
    assert public_message(text) == "The actor died unexpectedly before finishing this task."
    assert public_message("Failure # 3 (occurred at x)") == "Failure # 3 (occurred at x)"


@pytest.mark.parametrize(("text", "expected"), [
    ("RuntimeError: cannot open the store, password=hunter2 retrying",
     "RuntimeError: cannot open the store, password=<hidden> retrying"),
    ("ValueError: token hpo_abcdef0123456789abcdef0123 refused",
     "ValueError: token <hidden> refused"),
    ("KeyError: 'Authorization: Bearer sk-live-XYZ'",
     "KeyError: 'Authorization: Bearer <hidden>'"),
    ("OSError: api_key: s3cr3t and secret=abc", "OSError: api_key: <hidden> and secret=<hidden>"),
    ("ConnectionError: user:pw@db.internal:5432/app",
     "ConnectionError: <hidden>@db.internal:5432/app"),
    ("OSError: cannot read file:/srv/x/y", "OSError: cannot read file:<path>"),
    ("OSError: cannot read path:/home/u/data", "OSError: cannot read path:<path>"),
    ("FileNotFoundError: ../../etc/shadow", "FileNotFoundError: <path>"),
    ("ValueError: ratio 10:30 and a/b and 3/4", "ValueError: ratio 10:30 and a/b and 3/4"),
    ("see https://user:pw@example.com/x", "see https://..."),
    # helper-34: quoted values, spaced '=', dict keys, other key names, basic credentials,
    # passwords holding ':' or '@'
    ("E: dsn host=db user=bob password='s3cr3t' dbname=x",
     "E: dsn host=db user=bob password=<hidden> dbname=x"),
    ('TypeError: connect(password="s3cr3t")', "TypeError: connect(password=<hidden>)"),
    ("E: {'password': 'hunter2'} and password = hunter2",
     "E: {'password': <hidden>} and password = <hidden>"),
    ("E: secret_key=abc private_key=xyz api_key = sk-1 HF_TOKEN=hf_2",
     "E: secret_key=<hidden> private_key=<hidden> api_key = <hidden> HF_TOKEN=<hidden>"),
    ("E: Authorization: Basic dXNlcjpwdw==", "E: Authorization: Basic <hidden>"),
    ("E: HF_TOKEN: hf_abc db_password: x", "E: HF_TOKEN: <hidden> db_password: <hidden>"),
    ("E: login admin:pa:ss@db.internal", "E: login <hidden>@db.internal"),
    ("E: login user:p@ss@db.internal", "E: login <hidden>@db.internal"),
    # and ordinary text left alone
    ("ValueError: password: too short", "ValueError: password: too short"),
    ("ValueError: secret: must be a string", "ValueError: secret: must be a string"),
    ("RuntimeError: shape mismatch at layer:conv1@block2",
     "RuntimeError: shape mismatch at layer:conv1@block2"),
    ("ValueError: could not parse '12:30@UTC'", "ValueError: could not parse '12:30@UTC'"),
    ("ValueError: max_tokens=5 and tokens=3", "ValueError: max_tokens=5 and tokens=3"),
])
def test_public_message_hides_secrets_and_paths_in_their_other_forms(text, expected):
    """helper-32: a trial's fail_reason (shown to viewers too) kept a password, a service
    token and a bearer credential of the task's error, and paths after a label or climbing
    with ``..``."""
    assert public_message(text) == expected
