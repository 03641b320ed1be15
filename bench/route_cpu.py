"""CPU of the API process per request, by route: one client, one request at a time, against
``python -m service.server`` on a fresh PostgreSQL schema (its dispatcher and local Ray on).
Prints, per operation, the server process's CPU ms per request (user + system, from
/proc/PID/stat) and the median wall ms. What bench/load.py's p99 follows: with 20
closed-loop clients, latency is about the clients over the throughput, and the throughput
about the API's cores over its CPU per request.

    python bench/route_cpu.py [--repeats 150]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from load import admin_token, fresh_schema, tiny  # noqa: E402
from service_overhead import _wait_ready  # noqa: E402


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=150)
    parser.add_argument("--port", type=int, default=8799)
    args = parser.parse_args()
    with fresh_schema("routecpu") as url:
        run(args, url)


def run(args, url: str) -> None:
    token = admin_token(url, "routecpu")
    env = {**os.environ, "HPO_DATABASE_URL": url, "HPO_PORT": str(args.port),
           "HPO_RESULTS_DIR": f"/tmp/hpo-routecpu-{os.getpid()}", "HPO_NUM_CPUS": "2"}
    env.pop("RAY_ADDRESS", None)
    server = subprocess.Popen([sys.executable, "-m", "service.server"], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{args.port}"
    try:
        _wait_ready(base, server, warm=True)
        names = [f"rc-{i}-{uuid.uuid4().hex[:6]}" for i in range(args.repeats)]
        ops = [("create", lambda n: ("POST", "/v1/studies", {"json": tiny(n)})),
               ("read", lambda n: ("GET", f"/v1/studies/{n}", {})),
               ("list", lambda n: ("GET", "/v1/studies?limit=20", {})),
               ("stop", lambda n: ("POST", f"/v1/studies/{n}/stop", {})),
               ("delete", lambda n: ("DELETE", f"/v1/studies/{n}", {}))]
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                          timeout=60) as http:
            for op, make in ops:
                walls, codes = [], collections.Counter()
                c0 = cpu_s(server.pid)
                for n in names:
                    method, path, kw = make(n)
                    t0 = time.perf_counter()
                    codes[http.request(method, path, **kw).status_code] += 1
                    walls.append(time.perf_counter() - t0)
                cpu = (cpu_s(server.pid) - c0) / len(names)
                print(f"{op:8} CPU {1e3 * cpu:6.1f} ms/request   wall p50 "
                      f"{1e3 * statistics.median(walls):6.1f} ms   answers {dict(codes)}")
    finally:
        server.terminate()
        server.wait(120)


if __name__ == "__main__":
    main()
