"""Load: N concurrent clients creating, reading and stopping studies against a local server on
PostgreSQL, for a bounded time. Prints throughput, p50/p99 latency per operation, the count of
5xx and unexpected answers, and lost studies (goal: zero 5xx, zero lost studies).

Each client loops: create a study (a unique name), read it, list studies, stop it, and every
third time delete it once stopped. The server is ``python -m service.server`` with its
dispatcher and its own local Ray, so some studies are claimed and start a driver before their
stop arrives. At the end, every created study that was not deleted must be listed by the API
and exist in Optuna.

    python bench/load.py [--clients 20] [--seconds 60] [--api-processes 1] [--database-url URL]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import optuna
import sqlalchemy as sa

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from service_overhead import _wait_ready  # noqa: E402

PG_URL = os.environ.get("HPO_TEST_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/test")
EXPECTED = {"create": {201}, "read": {200}, "list": {200}, "stop": {202, 409},
            "delete": {204, 409}}


def tiny(name: str) -> dict:
    return {"name": name, "task": "digits", "config": {"max_epochs": 1, "width": 8},
            "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
            "objective": {"metric": "val_accuracy"}, "budget": {"n_trials": 2}}


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: dict[str, list[float]] = collections.defaultdict(list)
        self.codes: collections.Counter = collections.Counter()
        self.unexpected: list[str] = []
        self.created: set[str] = set()
        self.deleted: set[str] = set()

    def call(self, http: httpx.Client, op: str, method: str, path: str, **kw) -> httpx.Response:
        t0 = time.perf_counter()
        r = http.request(method, path, **kw)
        with self.lock:
            self.latency[op].append(time.perf_counter() - t0)
            self.codes[r.status_code] += 1
            if r.status_code not in EXPECTED[op]:
                self.unexpected.append(f"{op} {path} -> {r.status_code} {r.text[:200]}")
        return r


def client_loop(base: str, token: str, tally: Tally, deadline: float, seed: int) -> None:
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                      timeout=60) as http:
        i = 0
        while time.monotonic() < deadline:
            name = f"load-{seed}-{i}-{uuid.uuid4().hex[:6]}"
            if tally.call(http, "create", "POST", "/v1/studies", json=tiny(name)).status_code \
                    == 201:
                with tally.lock:
                    tally.created.add(name)
            tally.call(http, "read", "GET", f"/v1/studies/{name}")
            tally.call(http, "list", "GET", "/v1/studies?limit=20")
            stop = tally.call(http, "stop", "POST", f"/v1/studies/{name}/stop")
            if i % 3 == 0 and stop.status_code == 202 and stop.json()["status"] == "STOPPED" \
                    and tally.call(http, "delete", "DELETE",
                                   f"/v1/studies/{name}").status_code == 204:
                with tally.lock:
                    tally.deleted.add(name)
            i += 1


def lost_studies(base: str, token: str, url: str, tally: Tally) -> list[str]:
    headers = {"Authorization": f"Bearer {token}"}
    listed, offset = set(), 0
    while True:
        page = httpx.get(f"{base}/v1/studies?limit=500&offset={offset}", headers=headers,
                         timeout=60).json()
        listed |= {s["name"] for s in page["items"]}
        offset += 500
        if offset >= page["total"]:
            break
    in_optuna = {s.study_name for s in optuna.storages.RDBStorage(url).get_all_studies()}
    kept = tally.created - tally.deleted
    return sorted((kept - listed) | (kept - in_optuna))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--database-url", default=None, help="default: a fresh PostgreSQL schema")
    parser.add_argument("--port", type=int, default=8798)
    parser.add_argument("--api-processes", type=int, default=1,
                        help="the server's HPO_API_PROCESSES (default 1)")
    args = parser.parse_args()
    if args.database_url is not None:
        run(args, args.database_url)
    else:
        with fresh_schema("load") as url:
            run(args, url)


@contextlib.contextmanager
def fresh_schema(prefix: str):
    """A PostgreSQL URL on a new schema, dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with sa.create_engine(PG_URL).begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{PG_URL}{'&' if '?' in PG_URL else '?'}options=-csearch_path%3D{schema}"
    finally:
        with sa.create_engine(PG_URL).begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))


def admin_token(url: str, name: str) -> str:
    """The service's tables on ``url`` and an admin token ``name``."""
    from service.auth import create_token
    from service.db import build_engine, create_tables, session_factory

    engine = build_engine(url)
    create_tables(engine)
    try:
        return create_token(session_factory(engine), name, admin=True)
    finally:
        engine.dispose()


def run(args, url: str) -> None:
    token = admin_token(url, "load")
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"hpo-load-{os.getpid()}"
    env = {**os.environ, "HPO_DATABASE_URL": url, "HPO_PORT": str(args.port),
           "HPO_RESULTS_DIR": str(workdir), "HPO_NUM_CPUS": "2",
           "HPO_API_PROCESSES": str(args.api_processes)}
    env.pop("RAY_ADDRESS", None)
    server = subprocess.Popen([sys.executable, "-m", "service.server"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{args.port}"
    tally = Tally()
    try:
        _wait_ready(base, server, warm=True)
        load_before = os.getloadavg()[0]
        deadline = time.monotonic() + args.seconds
        threads = [threading.Thread(target=client_loop, args=(base, token, tally, deadline, i))
                   for i in range(args.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        load = (load_before, os.getloadavg()[0])
        lost = lost_studies(base, token, url, tally)
    finally:
        server.terminate()
        server.wait(120)
    report(args, tally, elapsed, lost, load)


def report(args, tally: Tally, elapsed: float, lost: list[str],
           load: tuple[float, float]) -> None:
    n = sum(len(v) for v in tally.latency.values())
    print(f"{args.clients} clients, {args.api_processes} API process(es), {elapsed:.0f} s: "
          f"{n} requests, {n / elapsed:.1f} req/s, "
          f"{len(tally.created)} studies created, {len(tally.deleted)} deleted; load average "
          f"{load[0]:.1f} at the start, {load[1]:.1f} at the end on {os.cpu_count()} CPUs")
    print(f"{'operation':10} {'count':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for op, samples in tally.latency.items():
        ordered = sorted(samples)
        p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
        print(f"{op:10} {len(samples):6d} {1e3 * statistics.median(ordered):8.1f} "
              f"{1e3 * p99:8.1f}")
    n_5xx = sum(c for code, c in tally.codes.items() if code >= 500)
    print(f"status codes: {dict(sorted(tally.codes.items()))}")
    print(f"5xx: {n_5xx}   unexpected answers: {len(tally.unexpected)}   lost studies: "
          f"{len(lost)}")
    for line in tally.unexpected[:10] + lost[:10]:
        print("  " + line)


if __name__ == "__main__":
    main()
