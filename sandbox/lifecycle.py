"""A process's lifecycle: who owns what it leaves on disk, and an exit that cleans up.

Who owns something left on disk: a process, named by its pid and its kernel start time.

A pid alone is not enough after a crash: the kernel recycles pids, and a new process with
the dead owner's pid would keep its leftovers forever. The start time (clock ticks since
boot) tells the two apart, so collectors (``deployment/reaper.py``, ``storage/temps.py``)
remove exactly what no live process holds. ``install_exit_handlers`` turns SIGTERM into a
normal exit, so the cleanup hooked to ``atexit`` (a run's sandboxes) runs.
"""

from __future__ import annotations

import os
import signal
import threading


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of a process (clock ticks since boot), None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


def alive(pid: int, start: int | None) -> bool:
    """The process ``pid`` that started at ``start`` still runs (not a recycled pid)."""
    return start is not None and proc_start_time(pid) == start


_me: tuple[int, str] = (0, "")


def tag() -> str:
    """``<pid>-<start>`` of this process (recomputed after a fork: the child is another owner)."""
    global _me
    pid = os.getpid()
    if _me[0] != pid:
        _me = (pid, f"{pid}-{proc_start_time(pid)}")
    return _me[1]


def install_exit_handlers() -> None:
    """Turn SIGTERM into a normal exit so atexit cleanup runs (only if nobody else
    handles SIGTERM, and only from the main thread, where signals can be set)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
