"""A ``--url`` urllib splits but cannot send (a space, a control character, a host label
IDNA refuses) is a usage error naming ``--url`` (exit 2), as an unsplittable one already
was; before, it was "internal error: InvalidURL" or "UnicodeError" (exit 1). Credentials
in the URL are refused, never echoed; a bad token is never echoed nor blamed on --url.
Run as the operator runs it: a subprocess of the installed entry point."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cellsight.cli.errors import RUNTIME, USAGE
from cellsight.cli.querysource import without_userinfo
from tests.cli.test_cli_errors import SECRET, assert_one_line_error, cellsight, closed_port

COMMANDS = [["query", "instance", "uuid"], ["query", "fields", "node"], ["nodes", "refresh"]]
BAD_URLS = {
    "space": ("http://a b", "control characters"),
    "encoded space": ("http://a%20b", "control characters"),
    "tab": ("http://a\tb", "control characters"),
    "label over 63": (f"http://{'a' * 70}.example", "label empty or too long"),
    "empty label": ("http://a..example", "label empty or too long"),
}


@pytest.mark.parametrize("command", COMMANDS, ids="-".join)
@pytest.mark.parametrize(("url", "why"), BAD_URLS.values(), ids=BAD_URLS.keys())
def test_a_url_urllib_cannot_send_is_a_usage_error_naming_it(
    tmp_path: Path, command: list[str], url: str, why: str
) -> None:
    result = cellsight(tmp_path / "d", *command, "--url", url)
    assert_one_line_error(result, USAGE, "--url http://", why)


@pytest.mark.parametrize("command", COMMANDS, ids="-".join)
@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@127.0.0.1:1",
        f"http://{SECRET}@127.0.0.1:1",
        f"ftp://user:{SECRET}@h",  # refused before the scheme is looked at
        f"http://user:{SECRET}@[::1",  # refused though urllib cannot split it
    ],
)
def test_credentials_in_the_url_are_refused_and_never_echoed(
    tmp_path: Path, command: list[str], url: str
) -> None:
    result = cellsight(tmp_path / "d", *command, "--url", url)
    # assert_one_line_error also checks SECRET appears nowhere in the line.
    assert_one_line_error(result, USAGE, "--url ", "***@", "credentials", "--token")


@pytest.mark.parametrize("token", [f"{SECRET}\nx", f"{SECRET}\x01", f"{SECRET}\u20ac"])
def test_a_token_no_header_can_carry_is_named_not_echoed(tmp_path: Path, token: str) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for env, args in [({}, ["--token", token]), ({"CELLSIGHT_API_TOKEN": token}, [])]:
        result = cellsight(tmp_path / "d", "query", "instance", "--url", url, *args, env=env)
        err = assert_one_line_error(result, USAGE, "token", "CELLSIGHT_API_TOKEN")
        assert "--url" not in err.split("(")[0], err


@pytest.fixture
def not_http() -> Iterator[str]:
    """A TCP server that answers every connection with a line that is no HTTP."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    server.close()
    thread.join(10)


def test_a_server_that_does_not_speak_http_is_a_runtime_error(
    tmp_path: Path, not_http: str
) -> None:
    # BadStatusLine is no OSError: it was an "internal error" before.
    result = cellsight(tmp_path / "d", "query", "instance", "--url", not_http)
    assert_one_line_error(result, RUNTIME, not_http, "not in HTTP", "BadStatusLine")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:pw@h:1/x", "http://***@h:1/x"),
        ("http://a@b@h/", "http://***@h/"),
        ("http://h/p@x", "http://h/p@x"),  # an "@" in the path is no userinfo
        ("http://h?a=b@c", "http://h?a=b@c"),
        ("http://h#f@g", "http://h#f@g"),
    ],
)
def test_only_the_authoritys_userinfo_is_masked(url: str, shown: str) -> None:
    assert without_userinfo(url) == shown
