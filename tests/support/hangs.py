"""A hung test fails with the stacks of every thread and every asyncio task in its report.

pytest-timeout times each test (`timeout` in pyproject.toml); its own report writes the stacks to the
terminal, which a pytest-xdist worker does not show, and knows nothing of tasks. Here SIGALRM fails the
test with all of them in the failure's text. A test stuck where the signal cannot reach Python (a call
in C that never returns) is the backstop's: faulthandler writes every thread's stack to stderr and ends
the process, and pytest-xdist reports the test that crashed its worker.
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import signal
import sys
import threading
import traceback
from types import FrameType
from typing import Any

import pytest

BACKSTOP_GRACE = 60.0  # seconds past the time limit before the process is ended


def _loops(frames: dict[int, FrameType]) -> list[asyncio.AbstractEventLoop]:
    """The event loops running in any thread: the `self` of a frame of their run_forever."""
    found: list[asyncio.AbstractEventLoop] = []
    for frame in frames.values():
        f: FrameType | None = frame
        while f is not None:
            loop = f.f_locals.get("self") if f.f_code.co_name == "run_forever" else None
            if isinstance(loop, asyncio.AbstractEventLoop) and loop not in found:
                found.append(loop)
            f = f.f_back
    return found


def stacks() -> str:
    """Every thread's stack, then every pending task's of every running loop."""
    out = io.StringIO()
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in frames.items():
        out.write(f"\n--- thread {names.get(ident, '?')} ({ident}) ---\n")
        out.write("".join(traceback.format_stack(frame)))
    for loop in _loops(frames):
        for task in asyncio.all_tasks(loop):
            out.write(f"\n--- task {task.get_name()} {task.get_coro()!r} ---\n")
            task.print_stack(file=out)
    return out.getvalue()


def set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest_timeout_set_timer: the signal method, with our report and the backstop."""
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own thread method

    def expired(signum: int, frame: FrameType | None) -> None:
        __tracebackhide__ = True
        pytest.fail(f"Timeout: the test took more than {settings.timeout:g} s. Stacks:\n{stacks()}",
                    pytrace=False)

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    faulthandler.dump_traceback_later(settings.timeout + BACKSTOP_GRACE, exit=True)
    item.stash[_ARMED] = True
    return True


def cancel_timer(item: pytest.Item) -> bool | None:
    if not item.stash.get(_ARMED, False):
        return None
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    faulthandler.cancel_dump_traceback_later()
    item.stash[_ARMED] = False
    return True


_ARMED = pytest.StashKey[bool]()
