"""Crash points: named places between two side effects of a verb, where a test can kill kappa.

A verb calls `crashpoint("promote.after_flip")` between its steps. Normally that does nothing.
A test arms it (`arm(name)` for a named point, or `arm_nth(n)` for the n-th point reached) and
the call raises `KappaCrashed`, which derives from BaseException so that no `except Exception`
or `except KappaError` on the way up swallows it: the verb stops exactly there, as if the
process had been killed, and whatever it had not done yet stays undone. The model-based test
crashes at every point it reaches; regression tests of a crash window arm the one they need.

`hook(name, fn)` runs `fn` at a point instead (a barrier for a race: let another verb run
between two steps). Nothing here costs anything when nothing is armed.

`faultpoint(name)` marks a place *inside* a step (a registry transaction open, say) where a fault
test injects a fault from outside (restarts the database, fills the disk) with `hook(name, fn)`.
It is not a crash point: never armed, not counted by `arm_nth`, not in `reached()` (dying there is
dying before the step, which the crash points already cover).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["KappaCrashed", "crashpoint", "faultpoint", "arm", "arm_nth", "disarm", "hook", "reached", "armed"]


class KappaCrashed(BaseException):
    """Raised at an armed crash point: kappa 'died' there."""


_lock = threading.Lock()
_armed: set[str] = set()
_nth: int | None = None
_hooks: dict[str, Callable[[], None]] = {}
#: Every point reached since the last `disarm()`, in order (the model test reports them).
_reached: list[str] = []


def crashpoint(name: str) -> None:
    """Mark a point between two side effects; raises KappaCrashed if armed, runs a hook if set."""
    global _nth
    if not (_armed or _nth is not None or _hooks or _recording):
        return
    with _lock:
        _reached.append(name)
        fn = _hooks.get(name)
        crash = name in _armed
        if _nth is not None:
            _nth -= 1
            if _nth <= 0:
                crash, _nth = True, None
    if fn is not None:
        fn()
    if crash:
        raise KappaCrashed(f"crash point {name}")


def faultpoint(name: str) -> None:
    """Run the hook set for `name` (a fault test's injection), if any; nothing else (see the module)."""
    if not _hooks:
        return
    with _lock:
        fn = _hooks.get(name)
    if fn is not None:
        fn()


_recording = False


def record(on: bool = True) -> None:
    """Record the points reached even when none is armed (for a test that enumerates them)."""
    global _recording
    _recording = on


def arm(*names: str) -> None:
    with _lock:
        _armed.update(names)


def arm_nth(n: int) -> None:
    """The n-th crash point reached from now (1 = the next one) raises."""
    global _nth
    if n < 1:
        raise ValueError("arm_nth counts from 1")
    with _lock:
        _nth = n


def hook(name: str, fn: Callable[[], None]) -> None:
    with _lock:
        _hooks[name] = fn


def armed() -> bool:
    return bool(_armed or _nth is not None)


def reached() -> list[str]:
    with _lock:
        return list(_reached)


def disarm() -> None:
    global _nth, _recording
    with _lock:
        _armed.clear()
        _hooks.clear()
        _reached.clear()
        _nth = None
        _recording = False


@contextmanager
def armed_at(*names: str) -> Iterator[None]:
    arm(*names)
    try:
        yield
    finally:
        disarm()
