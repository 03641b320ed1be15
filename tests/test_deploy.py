"""docker-compose.yml and the Dockerfile, checked by parsing (no Docker engine runs here).

Every service's command must parse as the project's (or Ray's) real command line, every
port must be one that command listens on, and every environment variable must be one
that the service's settings or Ray actually read.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import ray
import typer
import yaml
from ray.scripts.scripts import start as ray_start

import hpo.cli
from service.routers.health import router as health_router
from service.settings import Settings

REPO = Path(__file__).resolve().parents[1]
# read by libpq (psycopg) itself: https://www.postgresql.org/docs/current/libpq-envars.html
LIBPQ_VARIABLES = {"PGPASSWORD"}
_INTERPOLATION = re.compile(r"\$\{(\w+)(?::?([-?])([^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


@pytest.fixture(scope="module")
def dockerfile() -> str:
    return (REPO / "Dockerfile").read_text()


def _interpolate(value: str, given: dict[str, str]) -> str:
    """Compose's ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}``, from ``given``."""

    def one(m: re.Match) -> str:
        name, kind, rest = m.groups()
        if name in given:
            return given[name]
        assert kind == "-", f"${{{name}}} has no default and the test gives none"
        return rest

    return _INTERPOLATION.sub(one, value)


def _env(service: dict) -> dict[str, str]:
    env = service.get("environment", {})
    assert isinstance(env, dict), "environment as a mapping"
    return {k: _interpolate(str(v), {"RAY_AUTH_TOKEN": "t" * 32}) for k, v in env.items()}


def _argv(service: dict) -> list[str]:
    command = service["command"]
    if isinstance(command, str):
        return shlex.split(command)
    if command[:2] == ["bash", "-c"]:
        return shlex.split(command[2])
    return list(command)


def _commands(argv: list[str]) -> list[list[str]]:
    """``a && exec b`` as ``[[a...], [b...]]``."""
    out, current = [], []
    for word in argv:
        if word == "&&":
            out.append(current)
            current = []
        elif not (word == "exec" and not current):
            current.append(word)
    return [*out, current]


def _parse(command, args: list[str]) -> dict:
    """The parameters ``args`` give ``command``; raises on an unknown option or bad value."""
    return command.make_context(command.name or "cmd", list(args), resilient_parsing=False).params


def _hpo_command(name: str):
    """A command of the ``hpo`` CLI as a click command (typer carries its own click)."""
    group = typer.main.get_command(hpo.cli.app)
    assert name in group.commands, f"hpo has no command {name!r}: {sorted(group.commands)}"
    return group.commands[name]


def test_services_and_their_commands_exist(compose):
    services = compose["services"]
    assert set(services) == {"postgres", "head", "worker"}
    head = _commands(_argv(services["head"]))
    assert [c[:2] for c in head] == [["ray", "start"], ["hpo", "serve"]]
    ray_params = _parse(ray_start, head[0][2:])
    assert ray_params["head"] and ray_params["num_gpus"] == 0
    _parse(_hpo_command("serve"), head[1][2:])

    (worker,) = _commands(_argv(services["worker"]))
    assert worker[:2] == ["hpo", "worker"]
    worker_params = _parse(_hpo_command("worker"), worker[2:])
    assert worker_params["block"]  # the container lives as long as the node
    host, port = worker_params["address"].split(":")
    # the worker joins the head service at the port its ray start listens on
    assert host == "head" and int(port) == ray_params["port"]
    from hpo.workers import ray_start_command

    _parse(ray_start, ray_start_command(worker_params["address"], block=True)[2:])


def test_ports_are_the_ones_listened_on(compose):
    head = compose["services"]["head"]
    env = _env(head)
    settings = Settings.from_env(env)
    ray_port = _parse(ray_start, _commands(_argv(head))[0][2:])["port"]
    published = {int(p.split(":")[1]) for p in head["ports"]}
    assert published == {settings.port, ray_port}
    assert settings.host == "0.0.0.0"  # reachable from outside the container
    assert settings.ray_address == f"127.0.0.1:{ray_port}"
    # the healthcheck asks the service's readiness route at its port
    probe = " ".join(head["healthcheck"]["test"])
    assert f"http://127.0.0.1:{settings.port}/readyz" in probe
    assert "/readyz" in {route.path for route in health_router.routes}


def test_every_variable_is_read_by_the_project_or_ray(compose):
    settings_source = (REPO / "service" / "settings.py").read_text()
    ray_root = Path(ray.__file__).parent
    for name in ("head", "worker"):
        env = _env(compose["services"][name])
        default = Settings.from_env({})
        settings = Settings.from_env(env)  # raises, naming the variable, on a bad value
        for var in env:
            if var.startswith("HPO_"):
                assert f'"{var}"' in settings_source, f"{name}: {var} is not a setting"
            elif var in LIBPQ_VARIABLES:
                continue
            else:
                assert var.startswith("RAY_"), f"{name}: {var} is neither HPO_ nor RAY_"
                assert any(var in p.read_text(errors="ignore")
                           for p in ray_root.rglob("*.py")), f"Ray never reads {var}"
        # the variables change the settings they name (not silently ignored)
        assert settings.database_url != default.database_url
        assert str(settings.results_dir) == env["HPO_RESULTS_DIR"]
        assert settings.ray_auth_mode == "token"
        # the database is the compose postgres, with its user, password and database
        url = urlsplit(settings.database_url)
        db_env = compose["services"]["postgres"]["environment"]
        assert url.hostname == "postgres" and url.port == 5432
        assert url.username == db_env["POSTGRES_USER"]
        # the password reaches libpq as PGPASSWORD: compose cannot URL-encode it
        assert url.password is None
        assert _interpolate(env["PGPASSWORD"], {}) == _interpolate(
            db_env["POSTGRES_PASSWORD"], {})
        raw = compose["services"][name]["environment"]["PGPASSWORD"]
        assert _interpolate(raw, {"POSTGRES_PASSWORD": "p@ss%25/w:rd"}) == "p@ss%25/w:rd"
        assert Settings.from_env({**env, "PGPASSWORD": "p@ss%25/w:rd"}).database_url == \
            settings.database_url
        assert url.path == "/" + db_env["POSTGRES_DB"]
        assert url.scheme == "postgresql+psycopg"


def test_checkpoints_live_on_a_volume_every_node_mounts(compose):
    volumes = compose["volumes"]
    for name in ("head", "worker"):
        service = compose["services"][name]
        results = Path(_env(service)["HPO_RESULTS_DIR"])
        mounts = dict(v.split(":", 1) for v in service["volumes"])
        shared = [src for src, target in mounts.items()
                  if results.is_relative_to(target) and src in volumes]
        assert shared == ["shared"], f"{name}: {results} is not on the shared volume"
    postgres = compose["services"]["postgres"]
    assert any(v.split(":")[0] in volumes for v in postgres["volumes"])


def test_health_checks_and_start_order(compose):
    services = compose["services"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, name
            assert "healthcheck" in services[dependency], dependency


def test_worker_reserves_gpus_with_the_compose_syntax(compose):
    devices = compose["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert "deploy" not in compose["services"]["head"]


def test_images_build_from_the_dockerfile_with_its_arguments(compose, dockerfile):
    args = set(re.findall(r"^ARG (\w+)", dockerfile, re.MULTILINE))
    for name in ("head", "worker"):
        build = compose["services"][name]["build"]
        assert build["context"] == "."
        assert set(build.get("args", {})) <= args, f"{name}: unknown build argument"
    assert compose["services"]["head"]["build"]["args"]["TORCH_CUDA"] == "cpu"
    assert compose["services"]["worker"]["build"]["args"]["TORCH_CUDA"].startswith("cu")
    # what it copies exists, and it installs the same torch the project pins
    for line in re.findall(r"^COPY (.+)$", dockerfile, re.MULTILINE):
        for source in line.split()[:-1]:
            assert (REPO / source).exists(), source
    pinned = re.search(r'"torch==([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert f"torch=={pinned} --index-url https://download.pytorch.org/whl/${{TORCH_CUDA}}" \
        in dockerfile
    cmd = re.search(r"^CMD (.+)$", dockerfile, re.MULTILINE).group(1)
    assert yaml.safe_load(cmd)[:2] == ["hpo", "serve"]

