"""Clocks for the indexer benchmarks: CPU per stage, per-phase tallies, lag quantiles and
the resident memory of indexer processes."""

from __future__ import annotations

import contextlib
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellsight.indexer.engines.base import SearchEngine, WriteOp, WriteResult, WriteStatus


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Stages:
    """CPU seconds per stage, from wrappers that read the calling thread's CPU clock:
    the bus thread's receive (``_receive``: frames, which run the message callback), ack,
    decode and map (``cellsight.indexer.writer``'s ``decode`` and ``plan``), and on the writer
    threads the whole ``commit`` with the engine's ``bulk`` and reads inside it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._lock = threading.Lock()

    def timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                with self._lock:
                    self.cpu[name] = self.cpu.get(name, 0.0) + spent

        return wrapper

    @contextlib.contextmanager
    def on_writer(self) -> Iterator[None]:
        """Time the decode/map seam. The decode step is looked up by name: a faster
        decode path that renames it still gets its plan (decode + map) timed."""
        import cellsight.indexer.writer as w

        saved = {name: getattr(w, name) for name in ("decode", "plan") if hasattr(w, name)}
        for name, fn in saved.items():
            setattr(w, name, self.timed(name, fn))
        try:
            yield
        finally:
            for name, fn in saved.items():
                setattr(w, name, fn)

    def on_consumer(self, consumer: Any) -> None:
        consumer._receive = self.timed("receive", consumer._receive)
        consumer._ack = self.timed("ack", consumer._ack)
        consumer.writer.commit = self.timed("commit", consumer.writer.commit)

    def breakdown(self, process_cpu: float, count: int) -> dict[str, float]:
        """Microseconds of CPU per notification. ``overhead`` is the process's CPU minus
        the stages: batching, launching and settling writes, polling, metrics."""
        c = self.cpu.get
        reads = c("get_many", 0.0) + c("get_meta", 0.0)
        parts = {
            "receive": c("receive", 0.0),
            "ack": c("ack", 0.0),
            "decode": c("decode", 0.0),
            "map": c("plan", 0.0) - c("decode", 0.0),
            "engine_write": c("bulk", 0.0),
            "engine_reads": reads,
            "writer_other": c("commit", 0.0) - c("bulk", 0.0) - reads,
        }
        parts["overhead"] = process_cpu - sum(parts.values())
        return {k: round(v / count * 1e6, 1) for k, v in parts.items()}


class Instrumented:
    """The engine, recording when ``bulk`` returned for each document it took, and the
    CPU time of its calls into ``stages``."""

    def __init__(self, engine: SearchEngine, stages: Stages | None = None) -> None:
        self._engine = engine
        self.stages = stages or Stages()
        self.done: dict[str, float] = {}
        self._bulk = self.stages.timed("bulk", engine.bulk)
        self.get_many = self.stages.timed("get_many", engine.get_many)
        self.get_meta = self.stages.timed("get_meta", engine.get_meta)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def bulk(self, ops: Sequence[WriteOp]) -> list[WriteResult]:
        results: list[WriteResult] = self._bulk(ops)
        now = time.time()
        for op, r in zip(ops, results, strict=True):
            if r.status is WriteStatus.OK:
                self.done.setdefault(op.id, now)
        return results


def documents_in(engine: SearchEngine) -> int:
    engine.refresh("instance")
    return engine.count("instance")


def broker_pid() -> int | None:
    """RabbitMQ's Erlang VM on this machine (``beam.smp`` running ``rabbit``), if any."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"beam.smp" in cmdline and b"rabbit" in cmdline:
            return int(entry.name)
    return None


def machine_seconds() -> tuple[float, float]:
    """CPU seconds of the whole machine so far: (busy, all), summed over its cores."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    total = sum(fields[:8])  # guest time is already counted in user
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


@dataclass
class Section:
    """What a timed section cost outside the measured processes: the broker's CPU and the
    machine's busy CPU (every process, the benchmark's own threads included)."""

    broker_cpu: float = 0.0
    busy: float = 0.0
    capacity: float = 0.0  # CPU seconds the machine had: wall seconds x cores

    def __add__(self, other: Section) -> Section:
        return Section(
            self.broker_cpu + other.broker_cpu,
            self.busy + other.busy,
            self.capacity + other.capacity,
        )


class Machine:
    """Reads ``Section`` figures around a timed section (``with MACHINE.section():``);
    the last one is ``MACHINE.last``."""

    def __init__(self) -> None:
        self.broker = broker_pid()
        self.last = Section()

    @contextlib.contextmanager
    def section(self) -> Iterator[None]:
        b0, (busy0, all0) = cpu_seconds(self.broker), machine_seconds()
        try:
            yield
        finally:
            busy1, all1 = machine_seconds()
            self.last = Section(cpu_seconds(self.broker) - b0, busy1 - busy0, all1 - all0)


MACHINE = Machine()


@dataclass
class Tally:
    """One phase's totals over the rounds."""

    count: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    rounds: list[float] | None = None
    machine: Section | None = None
    writer_cpu: float = 0.0  # of ``cpu``, the writer process's share (if it has one)

    def add(
        self,
        count: int,
        seconds: float,
        cpu: float,
        machine: Section | None = None,
        writer_cpu: float = 0.0,
    ) -> None:
        self.count += count
        self.seconds += seconds
        self.cpu += cpu
        self.writer_cpu += writer_cpu
        self.rounds = [*(self.rounds or []), round(count / seconds, 1)]
        if machine is not None:
            self.machine = (self.machine or Section()) + machine

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else math.nan

    def summary(self, unit: str) -> dict[str, Any]:
        if not self.count:
            return {}
        one = unit.rstrip("s")
        out: dict[str, Any] = {
            unit: self.count,
            "seconds": round(self.seconds, 3),
            f"{unit}_per_s": round(self.rate, 1),
            "per_s_by_round": self.rounds,
            "cpu_seconds": round(self.cpu, 3),
            f"cpu_us_per_{one}": round(self.cpu / self.count * 1e6, 1),
        }
        if self.writer_cpu:
            # Which process sets the pace: each runs on one core at most.
            for process, cpu in (
                ("consumer", self.cpu - self.writer_cpu),
                ("writer", self.writer_cpu),
            ):
                out[f"cpu_us_per_{one}_{process}_process"] = round(cpu / self.count * 1e6, 1)
                out[f"{process}_process_core_share"] = round(cpu / self.seconds, 3)
        if self.machine is not None and self.machine.capacity:
            mc = self.machine
            out[f"broker_cpu_us_per_{one}"] = round(mc.broker_cpu / self.count * 1e6, 1)
            out["machine_busy_share"] = round(mc.busy / mc.capacity, 3)
        return out


def quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[k]


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it is gone or None)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """A loopback port nothing listens on (the OS picks it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    """Child processes, without multiprocessing's resource tracker."""
    try:
        pids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    out = []
    for child in pids:
        with contextlib.suppress(OSError):
            if b"resource_tracker" not in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
    return out


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first), without resource trackers."""
    out = []
    for child in children(pid):
        out += [child, *descendants(child)]
    return out


class RssSampler(threading.Thread):
    """Samples the resident memory of ``pids()`` (each process on its own) every
    ``interval`` seconds until stopped."""

    def __init__(self, pids: Callable[[], list[int]], interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="rss")
        self.pids = pids
        self.interval = interval
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self.halt = threading.Event()
        self.started_at = time.monotonic()
        self.window_from = math.inf  # set when the timed window starts

    def mark(self) -> None:
        self.window_from = time.monotonic() - self.started_at

    def run(self) -> None:
        while not self.halt.is_set():
            now = time.monotonic() - self.started_at
            for pid in self.pids():
                mb = rss_mb(pid)
                if mb is not None:
                    self.samples.setdefault(pid, []).append((now, mb))
            self.halt.wait(self.interval)

    def summary(self) -> dict[str, Any]:
        """Per process over the timed window (start-up imports excluded): the peak, and
        the growth from a quarter into the window to its peak (flat memory: near 0)."""
        out = []
        for series in self.samples.values():
            values = [mb for at, mb in series if at >= self.window_from]
            if len(values) < 4:
                continue
            out.append(
                {
                    "samples": len(values),
                    "max_mb": round(max(values), 1),
                    "at_quarter_mb": round(values[len(values) // 4], 1),
                    "last_mb": round(values[-1], 1),
                    "growth_after_quarter_mb": round(max(values) - values[len(values) // 4], 1),
                }
            )
        return {
            "processes": out,
            "max_mb": max((p["max_mb"] for p in out), default=None),
        }
