"""The local Ray head tries ``ray.init`` again when Ray's fixed 30 s wait for its raylet
ran out (a loaded machine), and only then (``service.ray_head._init_local``)."""

from __future__ import annotations

import pytest

from service import ray_head

TIMED_OUT = Exception("The current node timed out during startup. This could happen "
                      "because some of the raylet failed to startup or the GCS has become "
                      "overloaded.")


class FakeRay:
    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    def init(self, **kwargs):
        self.calls.append(f"init {kwargs['address']} {kwargs['num_cpus']}")
        if self.failures:
            raise self.failures.pop(0)
        return "context"

    def shutdown(self):
        self.calls.append("shutdown")


def test_a_start_up_timeout_is_tried_again_after_a_shutdown():
    fake = FakeRay([TIMED_OUT, TIMED_OUT])
    assert ray_head._init_local(fake, 2) == "context"
    assert fake.calls == ["init local 2", "shutdown"] * 2 + ["init local 2"]


def test_the_last_timeout_ends_in_one_line_and_any_other_error_is_raised_at_once(capsys):
    fake = FakeRay([TIMED_OUT] * ray_head.START_TRIES)
    with pytest.raises(SystemExit) as ended:
        ray_head._init_local(fake, 2)
    assert ended.value.code == 1
    assert fake.calls == ["init local 2", "shutdown"] * ray_head.START_TRIES
    # the service's log (this process's stderr): a line per try, no traceback
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == ray_head.START_TRIES
    assert lines[-1] == f"ray_head: {TIMED_OUT} Gave up after {ray_head.START_TRIES} tries."
    assert ended.value.__cause__ is None and ended.value.__suppress_context__
    other = FakeRay([ValueError("num_cpus must be positive")])
    with pytest.raises(ValueError, match="num_cpus"):
        ray_head._init_local(other, 2)
    assert other.calls == ["init local 2"]
