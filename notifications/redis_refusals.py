"""A Redis bus that turns writes away until its operator frees room, told apart from one
that answers an error for good.

Redis refuses every write with ``MISCONF`` while it cannot persist (its last append to
its log or its last snapshot failed: a full or failing disk), and with ``OOM`` at its
memory limit. Both pass once room is freed, and both reach redis-py as a bare
``ResponseError`` when a script meets them (the consumer's takes are scripts), so
neither the error's class nor its text tells. The server does: once a command has
failed, it is asked for a PING (which Redis refuses exactly while a disk error stops
its writes) and for its ``INFO`` (why, and its memory), and if it turns writes away the
error becomes ``WritesRefused``, a redis-py ``ConnectionError`` (as redis-py makes
``BusyLoadingError``, a server still loading its data). kombu's publishers and the
indexer treat it as a server that does not answer for now: they back off and try again,
and acknowledge nothing meanwhile. Before this the indexer exited 1 on a full data
directory (an adversarial probe filled one) and its restarts failed the same way.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.client import Pipeline
from redis.exceptions import NoPermissionError, OutOfMemoryError, ResponseError

__all__ = ["RefusalAwareRedis", "WritesRefused", "raise_refusal", "refusal", "refusal_reason"]


class WritesRefused(redis.exceptions.ConnectionError):
    """The Redis server refuses writes until its disk or memory has room again."""


def refusal_reason(info: dict[str, Any], *, ping_refused: bool) -> str | None:
    """Why a server whose ``INFO`` (persistence and memory sections) is ``info`` turns
    writes away, or None if nothing says it does. Redis refuses even PING exactly while
    a disk error stops its writes, whatever its configuration says about that (a failed
    snapshot stops nothing under ``stop-writes-on-bgsave-error no``), so the disk is
    named only when PING was refused. At its memory limit a server refuses writes
    only under a policy that cannot evict every key (``noeviction``, ``volatile-*``)."""
    if ping_refused:
        if info.get("aof_enabled") and info.get("aof_last_write_status") == "err":
            return "it cannot append to its log (is its disk full?)"
        if info.get("rdb_last_bgsave_status") == "err":
            return "its last snapshot failed (is its disk full?)"
        return "it cannot persist (is its disk full?)"
    limit = info.get("maxmemory") or 0
    policy = str(info.get("maxmemory_policy", "noeviction"))
    evicts_any = policy.startswith("allkeys-")
    if limit and not evicts_any and (info.get("used_memory") or 0) >= limit:
        return "it is at its memory limit (maxmemory)"
    return None


def refusal(pool: redis.ConnectionPool, exc: ResponseError) -> WritesRefused | None:
    """A ``WritesRefused`` naming why, if ``exc`` came from a server (the one behind
    ``pool``) that turns writes away for now; None if it is an error for good. The
    server is asked on a connection of its own: the failed one may be a pipeline's or
    a blocking take's. A server that does not answer that is a connection error
    (raised); one whose user may not ask (ACLs deny ``INFO`` to many) is taken at its
    error's word."""
    if isinstance(exc, OutOfMemoryError):
        return WritesRefused(f"the Redis server refuses writes at its memory limit: {exc}")
    client = redis.Redis(connection_pool=pool)
    try:
        client.ping()
        ping_refused = False
    except NoPermissionError:
        return None
    except ResponseError:
        ping_refused = True
    try:
        info = {**client.info("persistence"), **client.info("memory")}
    except ResponseError:
        info = {}
        if not ping_refused:
            return None
    reason = refusal_reason(info, ping_refused=ping_refused)
    return None if reason is None else WritesRefused(f"the Redis server refuses writes: {reason}")


def raise_refusal(pool: redis.ConnectionPool, exc: ResponseError) -> None:
    """Raises ``refusal``'s ``WritesRefused`` from ``exc`` if there is one; the caller
    re-raises ``exc`` itself otherwise."""
    if (refused := refusal(pool, exc)) is not None:
        raise refused from exc


class RefusalAwarePipeline(Pipeline):
    def execute(self, raise_on_error: bool = True) -> list[Any]:
        try:
            return super().execute(raise_on_error)
        except ResponseError as exc:
            raise_refusal(self.connection_pool, exc)
            raise


class RefusalAwareRedis(redis.Redis):
    """redis-py's client, whose commands and pipelines raise ``WritesRefused`` where the
    server turns writes away until it has room."""

    def execute_command(self, *args: Any, **options: Any) -> Any:
        try:
            return super().execute_command(*args, **options)
        except ResponseError as exc:
            raise_refusal(self.connection_pool, exc)
            raise

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return RefusalAwarePipeline(
            self.connection_pool, self.response_callbacks, transaction, shard_hint
        )
