"""``CELLSIGHT_*`` environment variables that are not settings: typos, names the test
suite and the deployment examples read, and what Kubernetes puts in every pod."""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence

ENV_PREFIX = "CELLSIGHT_"
# What Kubernetes puts in every pod for a Service named cellsight[-...] (its "service
# links"): SVC_SERVICE_HOST, SVC_SERVICE_PORT[_NAME], SVC_PORT[_N_PROTO[_PROTO|_PORT|_ADDR]].
# A bare SVC_PORT is told from a typo by its value, tcp://10.0.0.1:8774.
_SERVICE_LINK = re.compile(
    r"CELLSIGHT(_[A-Z0-9_]+)?_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?"
    r"|PORT_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)"
)
_LINK_PORT = re.compile(r"CELLSIGHT(_[A-Z0-9_]+)?_PORT")
_LINK_VALUE = re.compile(r"(tcp|udp|sctp)://\S+", re.IGNORECASE)
# ``CELLSIGHT_*`` variables that are not settings: read by the test suite and by the
# deployment's HAProxy example, which share the environment.
NOT_SETTINGS = frozenset({
    "CELLSIGHT_BACKEND", "CELLSIGHT_DIFF_EXAMPLES", "CELLSIGHT_NOVA_SAMPLES",
    "CELLSIGHT_REQUIRE_SERVICES", "CELLSIGHT_SCHEMATHESIS_EXAMPLES", "CELLSIGHT_TEST_AMQP_URL",
    "CELLSIGHT_TEST_MARIADB_URL", "CELLSIGHT_TEST_POSTGRES_URL",
})  # fmt: skip


def unknown_variables(environ: Mapping[str, str], settings: Sequence[str]) -> list[str]:
    """One line per ``CELLSIGHT_*`` variable that is no setting, naming the setting it
    most resembles: pydantic-settings passes over such a variable in silence, so a typo
    (``CELLSIGHT_BUS_ULR``) would leave the embedded default in place unnoticed."""
    known = [name.upper() for name in settings]
    lines = []
    for name in sorted(environ):
        # pydantic-settings reads the names case-insensitively: compare as it does.
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in NOT_SETTINGS:
            continue
        rest = upper[len(ENV_PREFIX) :]
        if rest in known or _service_link(upper, environ[name]):
            continue
        # The rest of the name only: the prefix they all share would make anything close.
        close = difflib.get_close_matches(rest, known, n=1, cutoff=0.75)
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
        lines.append(f"ignoring {name}: not a setting{hint}")
    return lines


def _service_link(name: str, value: str) -> bool:
    return bool(
        _SERVICE_LINK.fullmatch(name)
        or (_LINK_PORT.fullmatch(name) and _LINK_VALUE.fullmatch(value))
    )


def service_link_value(value: str) -> bool:
    """Whether ``value`` reads as a Kubernetes service link's (``tcp://10.0.0.1:8774``)."""
    return bool(_LINK_VALUE.fullmatch(value.strip()))


def service_link_hint(name: str) -> str:
    """Why a setting holds a service link's value, and what to do about it."""
    service = name.lower().removesuffix("_port").replace("_", "-")
    return (
        f"; that is a Kubernetes service link: a Service named {service!r} sets it in "
        "every pod of its namespace (name the Service otherwise, or set the pod's "
        "enableServiceLinks: false)"
    )
