"""``openstack server list`` (python-openstackclient, the OpenStack CLI itself) against
the app served by uvicorn, as an administrator and as a member, on both paths.

No Keystone: the README's recipe, run as written there (ports and token aside):
``clouds.yaml`` uses keystoneauth's ``admin_token`` plugin (a fixed token, Cellsight's
dev-mode ``user:project``) and ``compute_endpoint_override``; the CLI insists on
discovering an identity v3 endpoint before listing, so Python's own web server serves
the identity version document from a file (the one part that cannot exist here).
The CLI sends its own request shape: ``deleted=False`` always, ``all_tenants``,
``host``… and microversion 2.96.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from cellsight.api.app import create_app
from cellsight.indexer.engines.embedded import EmbeddedEngine
from tests.support.api_world import World, api_settings, load_index, project_tokens
from tests.support.serve import serving

pytest.importorskip("openstackclient")
OPENSTACK = Path(sys.executable).with_name("openstack")
README = Path(__file__).resolve().parents[2] / "README.md"
# The recipe's own addresses, replaced by the test's.
IDENTITY, API, TOKEN = "http://127.0.0.1:5050", "http://127.0.0.1:8774", "alice:demo"


def recipe() -> dict[str, str]:
    """The README's recipe: its identity document, web server command and clouds.yaml."""
    block = next(b for b in README.read_text().split("```sh\n") if "osc-identity" in b)
    files = dict(re.findall(r"cat > (\S+) <<'EOF'\n(.*?)\nEOF\n", block, re.S))
    server = next(line for line in block.splitlines() if "http.server" in line)
    return {
        "document": files["osc-identity/identity/v3/index.html"],
        "server": server,
        "clouds": files["clouds.yaml"],
    }


@contextmanager
def identity_server(tmp: Path) -> Iterator[str]:
    """The recipe's ``python3 -m http.server`` over the recipe's file, on a free port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    steps = recipe()
    (tmp / "osc-identity/identity/v3").mkdir(parents=True)
    (tmp / "osc-identity/identity/v3/index.html").write_text(
        steps["document"].replace(IDENTITY, url)
    )
    command = shlex.split(steps["server"].rstrip("& ").replace("5050", str(port)))
    assert command[:3] == ["python3", "-m", "http.server"], command
    served = subprocess.Popen(
        [sys.executable, *command[1:]], cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert served.poll() is None, served.stderr and served.stderr.read()
                assert time.monotonic() < deadline, "http.server did not start"
                time.sleep(0.02)  # polling a subprocess's socket: no event to wait on
        yield url
    finally:
        served.terminate()
        served.wait(10)


@pytest.fixture(scope="module")
def urls(sqlite_world: World, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("osc")
    indexed = EmbeddedEngine(tmp / "index.db", prefix="osc")
    load_index(indexed, sqlite_world)
    empty = EmbeddedEngine(tmp / "empty.db", prefix="osc_empty")
    index_app = create_app(api_settings(tmp / "i"), engine=indexed, registry=sqlite_world.registry)
    fanout_app = create_app(api_settings(tmp / "f"), engine=empty, registry=sqlite_world.registry)
    with (
        serving(index_app) as index_url,
        serving(fanout_app) as fanout_url,
        identity_server(tmp) as identity_url,
    ):
        yield {"index": index_url, "fanout": fanout_url, "identity": identity_url}
    indexed.close()
    empty.close()


def openstack(tmp: Path, urls: dict[str, str], path: str, token: str, *args: str) -> Any:
    clouds = tmp / "clouds.yaml"
    text = recipe()["clouds"]
    for theirs, ours in ((IDENTITY, urls["identity"]), (API, urls[path]), (TOKEN, token)):
        assert theirs in text, theirs
        text = text.replace(theirs, ours)
    clouds.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OS_")}
    env["OS_CLIENT_CONFIG_FILE"] = str(clouds)
    done = subprocess.run(
        [str(OPENSTACK), "--os-cloud", "cellsight", "server", "list", "-f", "json", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


def live_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not (r["deleted"] or r["forthcoming"])]


@pytest.mark.parametrize("path", ["index", "fanout"])
def test_server_list_as_admin_and_member(
    urls: dict[str, str], sqlite_world: World, tmp_path: Path, path: str
) -> None:
    rows = [r for _, r in sqlite_world.rows()]
    # Reservations (forthcoming) are listed only when asked for: never to Nova's clients.
    live = {r["uuid"] for r in live_rows(rows)}
    everyone = openstack(tmp_path, urls, path, "root:admin", "--all-projects", "--limit", "1000")
    assert {s["ID"] for s in everyone} == live

    token = project_tokens(sqlite_world)[0]["X-Auth-Token"]
    project = token.split(":")[1]
    mine = {r["uuid"] for r in live_rows(rows) if r["project_id"] == project}
    listed = openstack(tmp_path, urls, path, token)
    assert {s["ID"] for s in listed} == mine
    # Options a member may not use are dropped, as Nova drops them: same listing.
    dropped = openstack(tmp_path, urls, path, token, "--host", "nowhere", "--deleted")
    assert {s["ID"] for s in dropped} == mine


def test_a_member_asking_for_all_projects_is_refused(
    urls: dict[str, str], sqlite_world: World, tmp_path: Path
) -> None:
    token = project_tokens(sqlite_world)[0]["X-Auth-Token"]
    clouds_args = ("--all-projects",)
    with pytest.raises(AssertionError, match=r"403|Policy"):
        openstack(tmp_path, urls, "fanout", token, *clouds_args)
