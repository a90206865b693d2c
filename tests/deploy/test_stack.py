"""The production stack is checked without a container engine: the compose client
validates the files, every Cellsight setting the stack sets exists, every metric the
Grafana dashboard queries is one the code exports, and Prometheus scrapes the ports
the services listen on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellsight.settings import Settings
from tests.support.services import unavailable

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
OPENSEARCH = ROOT / "deploy" / "compose.opensearch.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "cellsight.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"

SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def compose_client() -> list[str]:
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    if legacy:
        return [legacy]
    reason = (
        "no compose client (neither the `docker compose` plugin nor `docker-compose`; "
        ".ci/run installs Debian's docker-compose)"
    )
    unavailable(reason)


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def env_file(path: Path) -> dict[str, str]:
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value
    return pairs


@pytest.mark.parametrize("files", [[COMPOSE], [COMPOSE, OPENSEARCH]], ids=["es8", "opensearch2"])
def test_the_compose_client_accepts_the_stack(files: list[Path]) -> None:
    client = compose_client()
    args = [a for f in files for a in ("-f", str(f))]
    result = subprocess.run(
        [*client, *args, "config"], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)
    services = resolved["services"]
    for name in ("search", "rabbitmq", "mariadb", "indexer", "outbox-relay", "api", "grafana"):
        assert "healthcheck" in services[name], name
        assert services[name].get("restart") == "unless-stopped", name
    for name in ("init", "sync"):
        assert services[name].get("restart") == "no"
    conditions = {
        dep: spec["condition"]
        for spec_name in ("indexer", "api", "sync")
        for dep, spec in services[spec_name]["depends_on"].items()
    }
    assert conditions["search"] == "service_healthy"
    assert conditions["init"] == "service_completed_successfully"


def test_every_cellsight_variable_the_stack_sets_is_a_setting() -> None:
    compose = load(COMPOSE)
    names: set[str] = set(env_file(ROOT / "deploy" / "stack.env"))
    for service in compose["services"].values():
        environment = service.get("environment") or {}
        names |= set(environment if isinstance(environment, dict) else [])
    fields = {f"CELLSIGHT_{name.upper()}" for name in Settings.model_fields}
    cellsight = {n for n in names if n.startswith("CELLSIGHT_")}
    assert cellsight, "the stack sets no Cellsight settings?"
    assert cellsight <= fields, cellsight - fields
    # and the values parse: Settings accepts the stack's environment as a whole
    values: dict[str, Any] = {
        n: v for n, v in env_file(ROOT / "deploy" / "stack.env").items() if n in cellsight
    }
    values.update(
        {
            k: str(v)
            for s in compose["services"].values()
            for k, v in (s.get("environment") or {}).items()
            if k.startswith("CELLSIGHT_")
        }
    )
    Settings(**{k.removeprefix("CELLSIGHT_").lower(): v for k, v in values.items()})


def exported_metrics() -> set[str]:
    """Every metric name the code declares with prometheus-client (base names)."""
    declared = re.compile(
        r"\b(?:Counter|Gauge|Histogram|Summary|Info|Enum)\(\s*[\"']([a-z_:]+)[\"']"
    )
    names = set()
    for package in ("indexer", "api", "cells", "notifications", "cellsight"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(declared.findall(path.read_text()))
    return names


def test_every_dashboard_metric_exists_in_the_code() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = set(re.findall(r"\bcellsight_[a-z_]+", " ".join(exprs)))
    exported = exported_metrics()
    assert {"cellsight_indexer_consumed", "cellsight_indexer_lag_seconds"} <= exported

    def base(series: str) -> str:
        for suffix in SUFFIXES:
            if series.endswith(suffix) and series.removesuffix(suffix) in exported:
                return series.removesuffix(suffix)
        return series

    missing = {base(s) for s in queried} - exported
    assert not missing, f"the dashboard queries metrics the code does not export: {missing}"
    titles = " ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in (
        "rate",
        "lag",
        "dead letters",
        "batch size",
        "latency",
        "fan-out",
        "safe-connect",
        "skipped",
    ):
        assert topic in titles, topic


def test_prometheus_scrapes_the_ports_the_services_listen_on() -> None:
    compose = load(COMPOSE)
    services = compose["services"]
    targets = {
        target
        for job in load(PROMETHEUS)["scrape_configs"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    base_env = compose["x-cellsight"]["environment"]
    assert base_env["CELLSIGHT_METRICS_PORT"] == "9100"
    # Worker i of ``indexer --workers N`` serves its metrics on the port + i.
    indexer = services["indexer"]["command"]
    workers = int(indexer[indexer.index("--workers") + 1]) if "--workers" in indexer else 1
    assert targets == {*(f"indexer:{9100 + i}" for i in range(workers)), "api:8774"}
    assert "--port" in services["api"]["command"]
    assert services["api"]["command"][services["api"]["command"].index("--port") + 1] == "8774"
    check = " ".join(services["indexer"]["healthcheck"]["test"])
    assert all(str(9100 + i) in check for i in range(workers))  # every worker, not only 0


def test_the_indexer_has_time_to_stop_cleanly() -> None:
    """A probe: graceful stops took 6-26 s, and Docker's default 10 s before SIGKILL ended
    most of them (nothing lost, all redelivered, but never the clean stop)."""
    from cellsight.indexer.consumer import SHUTDOWN_GRACE
    from cellsight.indexer.write_process import CLOSE_GRACE

    grace = load(COMPOSE)["services"]["indexer"]["stop_grace_period"]
    match = re.fullmatch(r"(\d+)s", grace)
    assert match, grace
    assert int(match[1]) >= 2 * (SHUTDOWN_GRACE + CLOSE_GRACE + 5)


def test_the_api_token_file_is_mounted_where_the_setting_points() -> None:
    compose = load(COMPOSE)
    api = compose["services"]["api"]
    assert api["environment"]["CELLSIGHT_TOKEN_FILE"] == "/run/secrets/cellsight_tokens"
    assert "cellsight_tokens" in api["secrets"]
    source = ROOT / compose["secrets"]["cellsight_tokens"]["file"]
    from cellsight.api.auth import load_tokens

    assert load_tokens(source), "the example token file does not load"


def test_the_image_runs_as_a_non_root_user_in_stages() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.count("FROM ") >= 2
    users = re.findall(r"^USER\s+(\S+)", dockerfile, re.M)
    assert users and users[-1] not in ("root", "0")
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
