"""How long a spec takes to be answered, for the largest bodies the service takes (issue 15.4).

Each case is a body under ``HPO_MAX_BODY_BYTES`` (1 MiB) built to be costly to validate:
the issue's 25 categoricals x 1000 choices (61 CPU-seconds before its 422); 23 of them
whose every value is valid (an admin's is accepted after 23,000 checks against the task);
a warm start of 1000 points over those choices; a config option holding 300,000 numbers;
40,000 unknown options; 20,000 search-space parameters; and the issue's costly options
(``num_workers: 1000000``, ``micro_batch_size: 1e12``, a 48 x 8192 x 4096 charlm). Each is
posted to ``POST /v1/studies`` of an in-process app (the test client, SQLite) with a member
token (bounded by ``service.bounds``) and with an admin token (not bounded); the bench
prints the status and the median and maximum milliseconds of ``--repeats`` posts, and the
same for the parse alone (``service.bounds.parse_bounded``). Goal: every member answer
within 100 ms. The app's start-up objects are frozen (``gc.freeze()``) as ``hpo serve``
freezes them: without it, a full collection (which a large body triggers) walks ~400,000
objects, about 140 ms here, and shows as a max near 200 ms.

    python bench/spec_bounds.py [--repeats 5] [--cases NAME ...]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INTS = ["micro_batch_size", "grad_accum_steps", "eval_batch_size", "max_epochs",
        "warmup_steps", "eval_interval", "checkpoint_interval", "keep_last_checkpoints",
        "early_stopping_patience", "seed", "width", "split_seed", "num_workers"]
FLOATS = ["lr", "weight_decay", "momentum", "adam_beta1", "adam_beta2", "min_lr_ratio",
          "wsd_decay_fraction", "init_loss_scale", "max_grad_norm", "dropout", "val_fraction",
          "early_stopping_min_delta"]


def base(name: str, **changes) -> dict:
    spec = {"name": name, "task": "digits", "objective": {"metric": "val_accuracy"},
            "budget": {"n_trials": 10}}
    spec.update(changes)
    return spec


def categoricals_25x1000(name: str) -> dict:
    """The issue's spec: 25 options of digits, each a categorical of 1000 numbers."""
    space = {n: {"type": "categorical", "choices": list(range(1, 1001))} for n in INTS}
    space.update({n: {"type": "categorical", "choices": [round(1e-4 * (i + 1), 4)
                                                          for i in range(1000)]}
                  for n in FLOATS})
    return base(name, search_space=space)


def valid_23x1000(name: str) -> dict:
    """As the issue's, without the two options that refuse most of 1..1000 (width,
    num_workers): every value is valid, so an admin's is checked value by value."""
    spec = categoricals_25x1000(name)
    for n in ("width", "num_workers"):
        del spec["search_space"][n]
    return spec


def warm_start_1000(name: str) -> dict:
    spec = categoricals_25x1000(name)
    spec["budget"] = {"n_trials": 1000}
    spec["warm_start"] = [{"params": {n: 1000 - i for n in INTS[:20]}} for i in range(1000)]
    return spec


CASES = {
    "25x1000 categoricals": categoricals_25x1000,
    "23x1000 valid choices": valid_23x1000,
    "warm start 1000 x 20": warm_start_1000,
    "config list 300k": lambda name: base(name, config={"lr": [0] * 300_000}),
    "config 40k unknown": lambda name: base(name, config={f"o{i}": 1 for i in range(40_000)}),
    "space 20k unknown": lambda name: base(name, search_space={
        f"p{i}": {"type": "int", "low": 0, "high": 1} for i in range(20_000)}),
    "num_workers 1e6": lambda name: base(name, config={"num_workers": 1_000_000}),
    "micro_batch_size 1e12": lambda name: base(name, config={"micro_batch_size": 1e12}),
    "charlm 48x8192x4096": lambda name: base(
        name, task="charlm", objective={"metric": "val_loss"},
        config={"n_layer": 48, "d_model": 8192, "block_size": 4096, "n_head": 64}),
    "small valid": lambda name: base(name, config={"max_epochs": 1}, search_space={
        "lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    args = parser.parse_args()

    from hpo.errors import SpecError
    from service.app import create_app
    from service.auth import Principal, create_token
    from service.bounds import parse_bounded
    from service.settings import Settings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
        from fastapi.testclient import TestClient

    tmp = Path(tempfile.mkdtemp(prefix="spec-bounds-"))
    settings = Settings(database_url=f"sqlite:///{tmp / 'bench.db'}",
                        results_dir=tmp / "results", run_dispatcher=False)
    app = create_app(settings)
    gc.freeze()  # as service.server.serve does: full collections walk only what requests keep
    print(f"load average {os.getloadavg()[0]:.1f}; {args.repeats} posts per case and token")
    print(f"{'case':24} {'bytes':>8} {'token':6} {'status':>6} {'post ms p50/max':>16} "
          f"{'parse ms p50/max':>17}")
    with TestClient(app) as client:
        sessions = app.state.components.sessions
        tokens = {"member": create_token(sessions, "member"),
                  "admin": create_token(sessions, "admin", admin=True)}
        who = {"member": Principal(token_id=0, name="member", is_admin=False),
               "admin": Principal(token_id=0, name="admin", is_admin=True)}
        client.post("/v1/studies", json=CASES["small valid"]("warm-up"),
                    headers={"Authorization": f"Bearer {tokens['admin']}"})
        n = 0
        for case in args.cases:
            for kind, token in tokens.items():
                posts, parses, statuses = [], [], set()
                for _ in range(args.repeats):
                    n += 1
                    spec = CASES[case](f"bench-{n}")
                    body = json.dumps(spec).encode()
                    start = time.perf_counter()
                    r = client.post("/v1/studies", content=body, headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json"})
                    posts.append(1000 * (time.perf_counter() - start))
                    statuses.add(r.status_code)
                    spec["name"] = f"bench-{n}-parse"
                    start = time.perf_counter()
                    with contextlib.suppress(SpecError):
                        parse_bounded(spec, who[kind], settings)
                    parses.append(1000 * (time.perf_counter() - start))
                status = "/".join(map(str, sorted(statuses)))
                print(f"{case:24} {len(body):8} {kind:6} {status:>6} "
                      f"{statistics.median(posts):8.1f}/{max(posts):7.1f} "
                      f"{statistics.median(parses):8.1f}/{max(parses):8.1f}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
