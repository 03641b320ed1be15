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
