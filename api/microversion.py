"""Compute API microversions: what the client asked for, what the answer is rendered as.

The client names a version in ``OpenStack-API-Version: compute X.Y`` (or the legacy
``X-OpenStack-Nova-API-Version: X.Y``); none means the minimum, 2.1, as in Nova;
``latest`` means ``MAX``. A version outside ``MIN..MAX`` is a 406, Nova's answer.
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
    raw: str | None = None
    header = request.headers.get(HEADER)
    for name in (HEADER, LEGACY_HEADER):
        if len(request.headers.get(name, "")) > MAX_HEADER_LENGTH:
            raise BadRequest(f"The {name} header is longer than {MAX_HEADER_LENGTH} characters.")
    if header:
        # "compute 2.60" (several services may be listed, comma-separated).
        for part in header.split(","):
            service, _, value = part.strip().partition(" ")
            if service.lower() == "compute":
                raw = value.strip()
    if raw is None:
        raw = request.headers.get(LEGACY_HEADER)
    if not raw:
        return MIN
    if raw.lower() == "latest":
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
