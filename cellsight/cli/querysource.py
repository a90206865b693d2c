"""Where ``cellsight query`` and ``cellsight nodes refresh`` get answers: a running API
(``--url``, over HTTP) or the local data directory (the API's own code, in-process)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pydantic-settings costs a tenth of a second: `--help` never needs it
    from cellsight.settings import Settings

ADMIN_TOKEN = "cli:admin"
TOKEN_HINT = "--token or CELLSIGHT_API_TOKEN: a token of the API's token_file"


class SourceError(Exception):
    """The source refused the request or could not be reached; the message says why.
    ``code`` is the exit code (``cellsight.cli.errors``): 2 for a request the source
    refuses as bad (4xx), 1 for a source that is down, unreachable or failing (5xx)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _code(status: int) -> int:
    from cellsight.cli.errors import RUNTIME, USAGE

    return USAGE if 400 <= status < 500 else RUNTIME


@dataclass
class Answer:
    body: dict[str, Any]
    skipped_cells: str | None = None


class Source(Protocol):
    def query(self, resource: str, fields: list[str], filter_text: str | None) -> Answer: ...

    def fields(self, resource: str) -> list[dict[str, str]]: ...

    def refresh_nodes(self) -> dict[str, Any]: ...


# The compute endpoint as a catalog lists it and the demo prints it: the API's root.
_VERSION_SUFFIX = "/v2.1"


class RemoteSource:
    def __init__(self, url: str, token: str = ADMIN_TOKEN, timeout: float = 30.0) -> None:
        base = url.rstrip("/")
        if base.endswith(_VERSION_SUFFIX):
            base = base[: -len(_VERSION_SUFFIX)]
        self.url, self.token, self.timeout = base, token, timeout

    def _call(self, method: str, path: str, body: Any = None) -> tuple[Any, dict[str, str]]:
        # urllib.request pulls in http.client and email: 20 ms every `--help` would pay
        import http.client
        import urllib.error
        import urllib.request
        from urllib.parse import urlsplit

        from cellsight.cli.errors import RUNTIME, USAGE

        if (shown := without_userinfo(self.url)) != self.url:
            # The API authenticates by X-Auth-Token alone; urllib would take "user:pw@h"
            # for the host name and echo it, password and all, in "cannot reach".
            raise SourceError(
                f"--url {shown}: credentials in the URL are not supported ({TOKEN_HINT})",
                USAGE,
            )
        try:
            parts = urlsplit(self.url)
            parts.port  # noqa: B018 - a port that is no number raises only when read
        except ValueError as exc:  # "Invalid IPv6 URL", a bad port
            raise SourceError(f"--url {self.url}: {exc}", USAGE) from None
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise SourceError(f"--url {self.url}: not an http:// or https:// URL", USAGE)
        if (problem := _header_problem(self.token)) is not None:
            # http.client would refuse it as a ValueError naming the value: the token,
            # in the clear, blamed on --url.
            raise SourceError(f"the token ({TOKEN_HINT}) {problem}", USAGE)
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"X-Auth-Token": self.token, "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw, headers = response.read(), dict(response.headers)
        except urllib.error.HTTPError as exc:
            fault = _fault(exc.read(), exc.code)
            if exc.code in (401, 403):
                fault = f"{fault} ({TOKEN_HINT})"
            elif exc.code == 404 and urlsplit(self.url).path:
                fault = f"{fault} (--url is the API's root, such as http://127.0.0.1:8774)"
            raise SourceError(f"{self.url}: {fault}", _code(exc.code)) from None
        except (http.client.InvalidURL, ValueError) as exc:
            # Raised before any connection, for a host urllib split but cannot send: a
            # space or a control character (InvalidURL, also after urllib unquotes
            # "a%20b"), a label IDNA refuses (UnicodeError: empty or over 63 characters).
            raise SourceError(f"--url {self.url}: {_first_line(exc)}", USAGE) from None
        except (urllib.error.URLError, OSError) as exc:
            # Down or unreachable: the service failed, not the command line (exit 1).
            reason = getattr(exc, "reason", exc)
            raise SourceError(f"cannot reach {self.url}: {reason}", RUNTIME) from None
        except http.client.HTTPException as exc:
            # Something listens there but does not speak HTTP (BadStatusLine, a cut-off
            # body): the service's fault, as an unreachable one is.
            why = f"{type(exc).__name__}: {_first_line(exc)}"
            raise SourceError(f"{self.url}: answered, but not in HTTP ({why})", RUNTIME) from None
        try:
            return json.loads(raw or b"null"), headers
        except ValueError:
            raise SourceError(
                f"--url {self.url}: answered, but not as the API does", USAGE
            ) from None

    def query(self, resource: str, fields: list[str], filter_text: str | None) -> Answer:
        body, headers = self._call(
            "POST", f"/v2.1/query/{resource}", {"fields": fields, "filter": filter_text}
        )
        lowered = {k.lower(): v for k, v in headers.items()}
        return Answer(body, lowered.get("x-cellsight-skipped-cells"))

    def fields(self, resource: str) -> list[dict[str, str]]:
        from urllib.parse import quote

        body, _ = self._call("GET", f"/v2.1/query/{quote(resource)}/fields")
        return list(body["fields"])

    def refresh_nodes(self) -> dict[str, Any]:
        body, _ = self._call("POST", "/v2.1/os-cellsight/nodes/refresh")
        return dict(body)


def without_userinfo(url: str) -> str:
    """``url`` with any ``user:password@`` masked, found without parsing: a URL urllib
    cannot split (``http://u:pw@[::1``) must not be echoed whole either."""
    scheme, sep, rest = url.partition("://")
    # The authority ends at the path, query or fragment: an "@" past it is no userinfo.
    end = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    at = rest.rfind("@", 0, end) if sep else -1
    return url if at < 0 else f"{scheme}://***@{rest[at + 1 :]}"


def _header_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as a header value, without repeating it."""
    import unicodedata

    if any(unicodedata.category(c) == "Cc" for c in value):
        return "contains a control character"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return "has a character HTTP headers cannot carry (not Latin-1)"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _fault(raw: bytes, status: int) -> str:
    try:
        (fault,) = json.loads(raw).values()
        return f"{status}: {fault['message']}"
    except (ValueError, TypeError, KeyError, AttributeError):
        return f"HTTP {status}"


class LocalSource:
    """The API's query code on the local data directory, as an administrator."""

    def __init__(self, settings: Settings) -> None:
        from cellsight.api.app import create_app

        self.app = create_app(settings)
        # No server lifespan runs here, so no background prober: probe once, as the
        # prober's first pass would, so the index serves when it can (and an engine that
        # is down is noticed here, not as a warning in the middle of the query).
        self.app.state.search.probe()

    def query(self, resource: str, fields: list[str], filter_text: str | None) -> Answer:
        from cellsight.api.auth import dev_principal
        from cellsight.api.errors import ApiError
        from cellsight.api.headers import SKIPPED_CELLS
        from cellsight.api.routes.query import QueryBody, _answer, _resource

        try:
            _resource(resource)
            response = _answer(
                self.app.state, dev_principal(ADMIN_TOKEN), resource, QueryBody(fields, filter_text)
            )
        except ApiError as exc:
            raise SourceError(exc.message, _code(exc.status)) from None
        return Answer(json.loads(bytes(response.body)), response.headers.get(SKIPPED_CELLS))

    def fields(self, resource: str) -> list[dict[str, str]]:
        from cellsight.api.query2.fields import RESOURCES, definitions

        if resource not in RESOURCES:
            raise SourceError(
                f"unknown resource {resource!r} (use {' or '.join(RESOURCES)})", _code(400)
            )
        return definitions(resource, None)

    def refresh_nodes(self) -> dict[str, Any]:
        from cellsight.api.routes.nodes import refresh_summary

        return refresh_summary(self.app.state)
