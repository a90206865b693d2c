"""Compute API microversions: what the client asked for, what the answer is rendered as.

The client names a version in ``OpenStack-API-Version: compute X.Y`` (or the legacy
``X-OpenStack-Nova-API-Version: X.Y``); none means the minimum, 2.1, as in Nova;
``latest`` (so spelt) means ``MAX``. A version outside ``MIN..MAX`` is a 406, Nova's
answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastapi import Request

from cellsight.api.errors import BadRequest, NotAcceptable
from cellsight.notifications.errors import clip

HEADER = "OpenStack-API-Version"
LEGACY_HEADER = "X-OpenStack-Nova-API-Version"
_VERSION = re.compile(r"^([1-9]\d*)\.(0|[1-9]\d*)$")
# Longer parts cannot name a served version; they are refused before ``int()`` (whose
# digit limit would make a 500 of a header of thousands of digits).
MAX_PART_DIGITS = 6
MAX_HEADER_LENGTH = 256


@dataclass(frozen=True, order=True)
class Version:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    def at_least(self, text: str) -> bool:
        return self >= parse(text)


def parse(text: str) -> Version:
    match = _VERSION.match(text.strip())
    if match is None:
        raise BadRequest(
            f"API Version String {clip(text, 40)} is of invalid format. Must be of format "
            "MajorNum.MinorNum.",
            parameter=HEADER,
        )
    major, minor = match.group(1), match.group(2)
    if len(major) > MAX_PART_DIGITS or len(minor) > MAX_PART_DIGITS:
        raise NotAcceptable(
            f"Version {clip(f'{major}.{minor}', 40)} is not supported by the API. "
            f"Minimum is {MIN} and maximum is {MAX}."
        )
    return Version(int(major), int(minor))


MIN = Version(2, 1)
MAX = Version(2, 96)


def requested(request: Request) -> Version:
    """The version as Nova reads it (``microversion_parse.get_version``): the header's
    lines joined with commas, its last ``compute X`` entry (an entry without a version
    is passed over), else the legacy header's last comma-separated part; ``latest``
    exactly as spelt; what then does not read as ``X.Y`` is a 400."""
    values: dict[str, str] = {}
    for name in (HEADER, LEGACY_HEADER):
        lines = request.headers.getlist(name)
        if lines:
            values[name] = ",".join(lines)
            if len(values[name]) > MAX_HEADER_LENGTH:
                raise BadRequest(
                    f"The {name} header is longer than {MAX_HEADER_LENGTH} characters."
                )
    raw: str | None = None
    for entry in reversed(values.get(HEADER, "").split(",")):
        words = entry.split(None, 1)
        if len(words) == 2 and words[0].lower() == "compute":
            raw = words[1].strip()
            break
    if raw is None and LEGACY_HEADER in values:
        raw = values[LEGACY_HEADER].split(",")[-1].strip()
    if raw is None:
        return MIN
    if raw == "latest":
        return MAX
    version = parse(raw)
    if not MIN <= version <= MAX:
        raise NotAcceptable(
            f"Version {version} is not supported by the API. Minimum is {MIN} and maximum is {MAX}."
        )
    return version


def response_headers(version: Version) -> dict[str, str]:
    return {
        HEADER: f"compute {version}",
        LEGACY_HEADER: str(version),
        "Vary": f"{HEADER}, {LEGACY_HEADER}",
    }
