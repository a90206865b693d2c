"""Which bus errors turn a client away for good (``bus.refused``): the indexer stops on
them instead of reconnecting. The CLI tests drive the real brokers; here, the rule."""

from __future__ import annotations

import amqp.exceptions
import pytest
import redis.exceptions

from cellsight.notifications.bus import refused

ALWAYS = [
    amqp.exceptions.AccessRefused("ACCESS_REFUSED - Login was refused"),
    redis.exceptions.AuthenticationError("invalid username-password pair"),
]
NEVER = [
    amqp.exceptions.ConnectionForced("CONNECTION_FORCED - broker forced connection closure"),
    amqp.exceptions.RecoverableConnectionError("connection reset"),
    redis.exceptions.ConnectionError("Connection refused"),
    redis.exceptions.TimeoutError("Timeout connecting to server"),
    ConnectionRefusedError(111, "Connection refused"),
    OSError("Network is unreachable"),
]
VHOST = amqp.exceptions.NotAllowed("NOT_ALLOWED - vhost cellsight not found")


@pytest.mark.parametrize("exc", ALWAYS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("consumed", [False, True])
def test_refused_credentials_are_final_at_any_time(exc: BaseException, consumed: bool) -> None:
    assert refused(exc, consumed=consumed)


@pytest.mark.parametrize("exc", NEVER, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("consumed", [False, True])
def test_an_outage_is_never_final(exc: BaseException, consumed: bool) -> None:
    assert not refused(exc, consumed=consumed)


def test_a_vhost_refused_is_final_only_before_the_first_consume() -> None:
    # Later, 530 is also a vhost restarting on its node or its connection limit reached.
    assert refused(VHOST, consumed=False)
    assert not refused(VHOST, consumed=True)
