"""The local Ray of ``hpo serve``: ``python -m service.ray_head [NUM_CPUS]``.

Starts a Ray head in this process (``ray.init``), prints one JSON line
``{"address": "IP:PORT", "auth_mode": "token"}`` and keeps Ray up until its
stdin ends (how ``LocalRay.stop`` stops it), SIGTERM, SIGINT or the death of
its parent (the service, even by SIGKILL). Ray's own processes
share this process's fate, so the whole local cluster goes with the service.
Study drivers join it with ``ray.init(address=...)``; the token that Ray's
token auth needs is the one ``ray.init`` keeps in ``~/.ray/auth_token``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from service.process import die_with_parent, end_session, lower_priority


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    num_cpus = int(args[0]) if args else None
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    die_with_parent(signal.SIGTERM)  # SIGTERM, so that ray.shutdown() stops Ray's agents too
    lower_priority()  # Ray's processes and the trials inherit it: the API comes first
    # the clean stop: end of input on stdin (a signal makes Ray's handler print a stack dump)
    threading.Thread(target=_set_at_end_of_input, args=(done,), daemon=True).start()
    import ray

    try:
        context = _init_local(ray, num_cpus)
        print(json.dumps({"address": context.address_info["gcs_address"],
                          "auth_mode": os.environ.get("RAY_AUTH_MODE")}), flush=True)
        done.wait()
        ray.shutdown()
    finally:  # also after a start that gave up, or a shutdown that failed (the review)
        end_session()  # what of Ray is left in this session of its own (its agents)
    return 0


START_TRIES = 3


def _init_local(ray, num_cpus: int | None):
    """``ray.init`` of a new local Ray, tried again when its node did not register in time:
    Ray waits a fixed 30 s for its raylet at start-up, which a loaded 2-core machine
    exceeds (seen under a test suite and a review's servers at load 16)."""
    for attempt in range(1, START_TRIES + 1):
        try:
            return _init(ray, num_cpus)
        except Exception as e:  # Ray raises a bare Exception for this one
            if "timed out during startup" not in str(e):
                raise
            ray.shutdown()
            then = (f"Trying again ({attempt + 1} of {START_TRIES})." if attempt < START_TRIES
                    else f"Gave up after {START_TRIES} tries.")
            print(f"ray_head: {e} {then}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None  # one line per try, as the service's own errors


def _init(ray, num_cpus: int | None):
    # address="local": always a new Ray, never one found running on this machine
    return ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                    logging_level="WARNING", log_to_driver=False)


def _set_at_end_of_input(done: threading.Event) -> None:
    sys.stdin.read()
    done.set()


if __name__ == "__main__":
    sys.exit(main())
