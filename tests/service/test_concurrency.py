"""50 concurrent clients creating and reading studies against a real server on PostgreSQL."""

from __future__ import annotations

import collections
import threading

import httpx
import pytest

from service.app import create_app
from service.auth import create_token
from service.settings import Settings
from tests.service.conftest import bearer, serve_in_thread, tiny_spec

N_CLIENTS = 50
pytestmark = pytest.mark.server


@pytest.fixture
def pg_server(pg_url, tmp_path):
    app = create_app(Settings(database_url=pg_url, results_dir=tmp_path, run_dispatcher=False))
    token = create_token(app.state.components.sessions, "load", admin=True)
    with serve_in_thread(app) as url:
        yield url, token, app


def test_50_concurrent_creates_and_reads_give_no_5xx_and_no_duplicate_names(pg_server):
    url, token, app = pg_server
    statuses: dict[str, list[int]] = collections.defaultdict(list)
    reads: list[int] = []
    barrier = threading.Barrier(N_CLIENTS)
    lock = threading.Lock()

    def client(i: int) -> None:
        name = f"c{i % 10}" if i % 2 == 0 else f"u{i}"  # 25 clients fight over 10 names
        with httpx.Client(base_url=url, headers=bearer(token), timeout=120) as http:
            barrier.wait()
            r = http.post("/v1/studies", json=tiny_spec(name))
            got = [http.get("/v1/studies?limit=100").status_code,
                   http.get(f"/v1/studies/{name}").status_code]
        with lock:
            statuses[name].append(r.status_code)
            reads.extend(got)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(N_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [s for codes in statuses.values() for s in codes] + reads
    assert not [s for s in every if s >= 500], collections.Counter(every)
    assert set(reads) == {200}
    for name, codes in statuses.items():
        assert sorted(codes) == [201] + [409] * (len(codes) - 1), (name, codes)
    listed = httpx.get(f"{url}/v1/studies?limit=500", headers=bearer(token)).json()
    names = [s["name"] for s in listed["items"]]
    assert len(names) == len(set(names)) == len(statuses) == listed["total"] == 30
    optuna_names = [s.study_name for s in app.state.components.studies.storage.get_all_studies()]
    assert sorted(optuna_names) == sorted(names)
