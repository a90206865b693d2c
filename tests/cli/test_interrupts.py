"""SIGTERM and Ctrl-C as ``KeyboardInterrupt`` without breaking a lock on the way."""

from __future__ import annotations

import signal
import sys
import threading
import time
from typing import Any

import pytest

from cellsight.cli.interrupts import PUT_OFF_AT_MOST, terminate_as_interrupt


def test_a_signal_while_a_wait_takes_its_lock_back_breaks_no_lock() -> None:
    """A probe's run: ``index verify`` stopped by SIGTERM ended with "internal error:
    RuntimeError: release unlocked lock" instead of exit 130. The signal had interrupted
    ``Condition.wait`` taking its lock back; the exception raised there made the wait's
    ``with`` release a lock the main thread did not hold. Here the lock is held by a
    thread that has just set the event, and the signal is sent to the main thread while
    it waits for that lock, every round."""
    rounds = 20
    interrupted = 0
    broken: list[BaseException] = []
    with terminate_as_interrupt():
        for _ in range(rounds):
            event = threading.Event()

            def setter(event: threading.Event = event) -> None:
                condition = event._cond  # type: ignore[attr-defined]
                while not condition._waiters:  # the main thread is waiting
                    time.sleep(0.0005)
                try:
                    with condition:  # Event.set, holding the lock a little longer
                        event._flag = True  # type: ignore[attr-defined]
                        condition.notify_all()
                        time.sleep(0.005)  # the main thread now waits for the lock
                        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
                        time.sleep(0.005)
                except RuntimeError as exc:
                    broken.append(exc)

            thread = threading.Thread(target=setter)
            thread.start()
            try:
                event.wait(10)
                time.sleep(0.01)  # the interrupt, if it was put off, comes by now
            except KeyboardInterrupt:
                interrupted += 1
            thread.join(10)
            assert not event._cond._lock.locked()  # type: ignore[attr-defined]
    assert not broken, broken[0]
    assert interrupted == rounds


@pytest.mark.parametrize("lock", [threading.Lock, threading.RLock])
def test_a_wait_taking_back_a_lock_held_long_waits_for_it(lock: Any) -> None:
    """CI, under load: the setter above held the lock past ``PUT_OFF_AT_MOST`` and the
    interrupt was raised while the wait took it back, breaking it ("release unlocked
    lock" in the holder). There it now waits for the lock, however long it is held."""
    condition = threading.Condition(lock())
    broken: list[BaseException] = []
    ready = threading.Event()

    def holder() -> None:
        while not condition._waiters:  # type: ignore[attr-defined]
            time.sleep(0.0005)
        try:
            with condition:
                condition.notify_all()
                ready.set()
                time.sleep(0.02)  # the main thread now waits to take the lock back
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
                time.sleep(3 * PUT_OFF_AT_MOST)
        except RuntimeError as exc:
            broken.append(exc)

    thread = threading.Thread(target=holder)
    with terminate_as_interrupt():
        thread.start()
        with pytest.raises(KeyboardInterrupt), condition:
            condition.wait(10)
            time.sleep(1)  # the interrupt, put off until the lock was held, comes by now
    thread.join(10)
    assert ready.is_set() and not broken, broken


def test_a_long_wait_is_still_interrupted_at_once() -> None:
    """Put off only inside a lock's few instructions: a wait that blocks for good (a
    verify's cells) takes the interrupt within ``PUT_OFF_AT_MOST``."""
    main = threading.main_thread().ident or 0
    sender = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGTERM))
    before = signal.getsignal(signal.SIGTERM)
    with terminate_as_interrupt():
        sender.start()
        started = time.monotonic()
        try:
            threading.Event().wait(30)
        except KeyboardInterrupt:
            waited = time.monotonic() - started
        else:
            raise AssertionError("the wait was not interrupted")
    sender.join()
    assert waited < 5, waited
    assert signal.getsignal(signal.SIGTERM) is before  # put back


def test_an_interrupt_put_off_as_the_block_ends_is_raised_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The timer that brings a put-off interrupt back is cancelled as the block ends: the
    interrupt is raised there rather than lost."""
    from cellsight.cli import interrupts

    def inside_a_lock() -> None:  # stands for Condition's few instructions
        interrupts.raise_interrupt(signal.SIGTERM, sys._getframe())

    monkeypatch.setattr(interrupts, "_UNSAFE", frozenset({inside_a_lock.__code__}))
    monkeypatch.setattr(interrupts, "RETRY_AFTER", 60.0)  # only the block's end brings it
    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        inside_a_lock()  # put off: no exception here
        reached = True
    assert reached
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_interrupt_put_off_then_raised_leaves_no_second_one_behind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A review: a put-off interrupt's timer, left armed when another signal raised the
    interrupt in safe code, raised a second one a millisecond later, in the clean-up."""
    from cellsight.cli import interrupts

    def inside_a_lock() -> None:
        interrupts.raise_interrupt(signal.SIGTERM, sys._getframe())

    monkeypatch.setattr(interrupts, "_UNSAFE", frozenset({inside_a_lock.__code__}))
    cleaned = False
    with terminate_as_interrupt():
        try:
            inside_a_lock()  # put off, its timer armed
            interrupts.raise_interrupt(signal.SIGINT, sys._getframe())  # safe: raised
        except KeyboardInterrupt:
            time.sleep(0.05)  # the clean-up, long past the timer's millisecond
            cleaned = True
        # A stray SIGALRM with nothing put off is nobody's interrupt.
        interrupts.raise_interrupt(signal.SIGALRM, sys._getframe())
    assert cleaned


def test_an_interrupt_is_described_without_importing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt probe: Ctrl-C during a command's own imports (kombu, redis) ended in
    a traceback, exit 1: describing it imported those half-imported packages again. A
    package that cannot be imported now stands for them."""
    from cellsight.cli.errors import INTERRUPTED, describe

    monkeypatch.setitem(sys.modules, "cellsight.clients", None)
    assert describe(KeyboardInterrupt()) == (INTERRUPTED, "interrupted")


def test_an_interrupt_as_the_options_are_parsed_is_said(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same probe: Ctrl-C while Click parsed the options exited 130 saying nothing
    (Typer turns it into a bare exit): one line, as every interrupt."""
    import typer

    from cellsight.cli import BoundaryGroup, app

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    from cellsight.cli.context import error_line

    error_line("an earlier command's error, in this process (as in the test suite)")
    capsys.readouterr()
    monkeypatch.setattr(BoundaryGroup, "make_context", interrupted)
    with pytest.raises(SystemExit) as ended:
        typer.main.get_command(app).main(["cells", "list"], prog_name="cellsight")
    assert ended.value.code == 130
    assert capsys.readouterr().err.strip() == "error: interrupted"


def test_an_interrupt_in_a_finalizer_is_raised_after_it() -> None:
    """An interrupt probe: a SIGTERM whose handler ran in a ``__del__`` (a driver's
    connection being finalized) was dropped with the finalizer's exception, and the
    seed ran to its end, exit 0. It is put off until the finalizer has returned."""
    finalized: list[bool] = []

    class Finalized:
        def __del__(self) -> None:
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
            finalized.append(True)  # its handler runs here, in the finalizer

    with pytest.raises(KeyboardInterrupt), terminate_as_interrupt():
        Finalized()  # made and finalized at once
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the interrupt, put off, comes back at once
            time.sleep(0.001)
    assert finalized == [True]


@pytest.mark.parametrize("where", ["import", "build"])
def test_an_interrupt_while_the_cli_starts_is_said_in_one_line(where: str) -> None:
    """An interrupt probe: a Ctrl-C in a command's first moment, while Python imports
    the CLI, ended it with Python's traceback; a review: also while Typer builds the
    command, after the import. Here it lands in the import of Typer, or in Typer's
    ``get_command``, as a signal's handler would raise it there."""
    import subprocess

    program = """
import sys

class Interrupted:
    def find_spec(self, name, *args):
        if name == "typer":
            raise KeyboardInterrupt
        return None

if WHERE == "import":
    sys.meta_path.insert(0, Interrupted())
else:
    import typer.main

    def get_command(*args):
        raise KeyboardInterrupt

    typer.main.get_command = get_command
sys.argv = ["cellsight", "--help"]
from cellsight.launch import main
main()
""".replace("WHERE", repr(where))
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "error: interrupted\n"
    assert done.stdout == ""
