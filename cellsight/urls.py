"""Service URLs as the clients read them, and as messages show them (no password)."""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit, urlunsplit


def split_url(url: str) -> SplitResult:
    """``url`` split, its port read: ``ValueError`` in urllib's words for a host or port
    that does not parse (an unclosed IPv6 bracket, a port past 65535 or not a number),
    which ``urlsplit`` alone leaves for the port's first use, deep inside a client."""
    parts = urlsplit(url)
    parts.port  # noqa: B018 - parsed on first use
    return parts


def redact_url(url: str) -> str:
    """``url`` without its password, for messages and logs."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket: no parts, so no user info either
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}***@{rest.rpartition('@')[2]}" if "@" in rest else url
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc))


def redact_urls(urls: str) -> str:
    """``redact_url`` of each URL of a ``;``-separated failover list (kombu's)."""
    return ";".join(redact_url(url) for url in urls.split(";"))
