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


def test_the_last_timeout_and_any_other_error_are_raised_at_once():
    fake = FakeRay([TIMED_OUT] * ray_head.START_TRIES)
    with pytest.raises(Exception, match="timed out during startup"):
        ray_head._init_local(fake, 2)
    assert fake.calls.count("init local 2") == ray_head.START_TRIES
    other = FakeRay([ValueError("num_cpus must be positive")])
    with pytest.raises(ValueError, match="num_cpus"):
        ray_head._init_local(other, 2)
    assert other.calls == ["init local 2"]
