"""Who is asking: tokens to principals, in development or token-file mode.

* ``dev`` (the embedded default, like Nova's ``noauth2``): ``X-Auth-Token`` is
  ``user:project`` (``user`` alone means project ``user``); project ``admin`` has the
  admin role. Nothing is verified: never expose this mode beyond one machine.
* ``token``: ``settings.token_file`` maps tokens to principals, as JSON (or TOML when the
  file name ends in ``.toml``)::

      {"<token>": {"user_id": "u1", "project_id": "p1", "roles": ["member"]}}

  Role ``admin`` makes an administrator. The file is read once at start.

A missing or unknown token is a 401 in both modes.
"""

from __future__ import annotations

import json
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request

from cellsight.api.errors import BadRequest, Unauthorized
from cellsight.settings import ConfigError, Settings, check_regular_file

TOKEN_HEADER = "X-Auth-Token"
ADMIN_ROLE = "admin"


@dataclass(frozen=True)
class Principal:
    user_id: str
    project_id: str
    roles: frozenset[str] = field(default_factory=frozenset)

    @property
    def is_admin(self) -> bool:
        return ADMIN_ROLE in self.roles


class Authenticator:
    """Maps a request's token to a ``Principal`` or raises ``Unauthorized``."""

    def __init__(self, mode: str, tokens: Mapping[str, Principal] | None = None) -> None:
        if mode not in ("dev", "token"):
            raise ConfigError(f"auth_mode {mode!r}: expected 'dev' or 'token'")
        self.mode = mode
        self.tokens = dict(tokens or {})

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        if settings.auth_mode == "dev":
            return cls("dev")
        if settings.token_file is None:
            raise ConfigError("auth_mode 'token' needs token_file (CELLSIGHT_TOKEN_FILE)")
        return cls("token", load_tokens(settings.token_file))

    def authenticate(self, token: str | None) -> Principal:
        # Only HTTP's own whitespace is trimmed: str.strip() also removes \x1c-\x1f, so
        # a token ending in one of those control characters would have authenticated.
        token = (token or "").strip(" \t")
        if not token:
            raise Unauthorized()
        if any(unicodedata.category(c) == "Cc" for c in token):
            # No token holds one (HTTP servers refuse most; an ASGI client need not): in
            # dev mode the project id carried it into the cell queries, a 500 there.
            raise BadRequest(f"{TOKEN_HEADER}: must not contain control characters")
        if self.mode == "dev":
            return dev_principal(token)
        principal = self.tokens.get(token)
        if principal is None:
            raise Unauthorized()
        return principal


def dev_principal(token: str) -> Principal:
    user, _, project = token.partition(":")
    project = project or user
    if not user or not project:
        raise Unauthorized()
    roles = frozenset({ADMIN_ROLE, "member"}) if project == ADMIN_ROLE else frozenset({"member"})
    return Principal(user, project, roles)


def load_tokens(path: Path) -> dict[str, Principal]:
    check_regular_file(path, "token file")
    try:
        text = path.read_text(encoding="utf-8")
        raw: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"token file {path}: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"token file {path}: expected an object of token → principal")
    tokens: dict[str, Principal] = {}
    for token, entry in raw.items():
        if not isinstance(entry, dict) or not entry.get("user_id") or not entry.get("project_id"):
            raise ConfigError(
                f"token file {path}: each entry needs user_id and project_id "
                f"(entry for a token starting {str(token)[:4]!r}…)"
            )
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ConfigError(f"token file {path}: roles must be a list of strings")
        tokens[str(token)] = Principal(
            str(entry["user_id"]), str(entry["project_id"]), frozenset(roles)
        )
    return tokens


def current_principal(request: Request) -> Principal:
    """The FastAPI dependency every authenticated route takes."""
    authenticator: Authenticator = request.app.state.authenticator
    principal = authenticator.authenticate(request.headers.get(TOKEN_HEADER))
    request.state.principal = principal
    return principal
