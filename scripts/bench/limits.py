"""What this machine allows the indexer, measured in the same run as the indexer."""

from __future__ import annotations

import os
from typing import Any


def bus_floor_limit(bus_floor: dict[str, Any], plain: dict[str, Any]) -> tuple[float, str] | None:
    """The ratio the bus and SQLite allow, measured beside the indexer: the indexer's own
    consumer with the floor's SQL behind it and nothing decoded (``bench/bus_floor.py``)."""
    rate = bus_floor.get("notifications_per_s")
    if not rate:
        return None
    return (
        round(rate / plain["messages_per_s"], 3),
        "bus + floor: the indexer's consumer, the same rows through the same SQL, no decode",
    )


def machine_limit(wp: dict[str, Any], plain: dict[str, Any]) -> dict[str, Any] | None:
    """The CPU each notification costs on this machine, the broker's share included, and
    the rate that cost allows if every core did nothing else: the limit the box sets
    (the benchmark's publisher is idle while these phases are timed)."""
    if "broker_cpu_us_per_notification" not in wp:
        return None
    cpus = os.cpu_count() or 1
    indexer = wp["cpu_us_per_notification"] + wp["broker_cpu_us_per_notification"]
    bus = plain["cpu_us_per_message"] + plain["broker_cpu_us_per_message"]
    return {
        "cpus": cpus,
        "indexer_and_broker_cpu_us_per_notification": round(indexer, 1),
        "indexer_machine_busy_share": wp["machine_busy_share"],
        "indexer_rate_with_every_core_busy": round(cpus * 1e6 / indexer),
        "plain_consumer_and_broker_cpu_us_per_message": round(bus, 1),
        "plain_consumer_machine_busy_share": plain["machine_busy_share"],
    }
