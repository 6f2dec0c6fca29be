"""N sandboxes created at once through ``rockroll serve`` (the SDK's ``remote`` backend, one
``asyncio.gather``, no semaphore of ours): bench/sandbox.py's burst on the local backend and
bench/cluster.py's on a Ray cluster behind the service. Each create is timed from the launch
to its sandbox being ready; then every sandbox is pinged and all are closed at once."""

from __future__ import annotations

import asyncio
import time
from typing import Callable

from _common import log, mem_available_mb, percentiles, stats, timer

from rockroll.sandbox import AsyncSandbox, SandboxSpec

SANDBOX_MB = 10        # what one idle sandbox (agent + bash) costs the host, for the memory check
HEADROOM_MB = 2048     # left to the rest of the machine (shared with others' jobs)


def concurrent_size(wanted: int, mb_each: float = SANDBOX_MB) -> tuple[int, dict]:
    """How many sandboxes the host can hold now: ``wanted``, or fewer if MemAvailable
    (``free -m``), less headroom for the others on this machine, cannot hold ``mb_each`` MiB
    of each."""
    avail = mem_available_mb()
    fits = max(1, int((avail - HEADROOM_MB) // mb_each))
    n = min(wanted, fits)
    memo = {"wanted": wanted, "n": n, "mem_available_mb": avail, "assumed_mb_per_sandbox": mb_each,
            "headroom_mb": HEADROOM_MB}
    if n < wanted:
        log(f"MemAvailable {avail} MiB holds only {n} sandboxes of ~{mb_each} MiB "
            f"(+{HEADROOM_MB} MiB headroom): measuring N={n}, not {wanted}")
    return n, memo


async def _concurrent_creates(n: int, cpu_s: Callable[[], float], spec: SandboxSpec,
                              held: Callable[[], dict] | None) -> dict:
    """``n`` creates launched at once; ``cpu_s()``: the CPU seconds of the processes that serve
    them (the service's tree, and a cluster's nodes), read before, after the creates and after
    the closes; ``held()``: what to read while all are held (before the closes)."""
    cpu0, client0 = cpu_s(), time.process_time()
    launched = time.perf_counter()

    async def one() -> tuple[object, float]:
        try:
            sb = await AsyncSandbox.create(spec)
        except Exception as e:  # noqa: BLE001 - a failure is a result here
            return e, time.perf_counter() - launched
        return sb, time.perf_counter() - launched

    results = await asyncio.gather(*(one() for _ in range(n)))
    created_s = time.perf_counter() - launched
    cpu1, client1 = cpu_s(), time.process_time()
    boxes = [r for r, _ in results if not isinstance(r, Exception)]
    errors = [r for r, _ in results if isinstance(r, Exception)]
    mem_after = mem_available_mb()
    while_held = held() if held else {}
    try:
        alive = sum(await asyncio.gather(*(b.ping() for b in boxes)))  # each one really answers
    finally:
        with timer() as t:
            closed = await asyncio.gather(*(b.close() for b in boxes), return_exceptions=True)
    close_errors = [c for c in closed if isinstance(c, BaseException)]
    await asyncio.sleep(2)  # the last agents are reaped
    cpu2 = cpu_s()
    done = max(1, n - len(errors))
    kinds: dict[str, int] = {}
    for e in errors:
        kinds[type(e).__name__] = kinds.get(type(e).__name__, 0) + 1
    return {"latencies": [dt for r, dt in results if not isinstance(r, Exception)], "created_s": created_s,
            "closed_s": t[0], "failures": len(errors), "failure_kinds": kinds,
            "first_failure": repr(errors[0]) if errors else None, "answered_ping": alive,
            "close_failures": len(close_errors), "mem_available_after_mb": mem_after, "while_held": while_held,
            "create_cpu_ms": (cpu1 - cpu0) * 1e3 / done, "close_cpu_ms": (cpu2 - cpu1) * 1e3 / done,
            "client_create_cpu_ms": (client1 - client0) * 1e3 / done,
            "sdk_max_connections": _sdk_connections()}  # reported, not changed


def _sdk_connections() -> int:
    from rockroll.sandbox.runtime import remote

    return remote.SHARDS * remote.SHARD_CONNECTIONS  # the SDK's pooled connections per event loop


def bench_concurrent(wanted: int, cpu_s: Callable[[], float], spec: dict, mb_each: float = SANDBOX_MB,
                     held: Callable[[], dict] | None = None) -> dict:
    from rockroll.sandbox.sync import run_sync

    n, memo = concurrent_size(wanted, mb_each)
    log(f"{n} sandboxes created at once through the service, disk_mb={SandboxSpec(**spec).disk_mb}")
    # On the sync API's loop: the SDK's one pooled client (max_connections=512, no pool
    # timeout), as an application would have it. We add no semaphore of our own.
    out = run_sync(_concurrent_creates(n, cpu_s, SandboxSpec(**spec), held))
    lat = out.pop("latencies")
    out.update(percentiles(lat, 50, 99), median=stats(lat)["median"])
    out["created"] = out.pop("n")  # the percentiles' count: the creates that succeeded
    out.update(memo)
    out["mb_per_sandbox_observed"] = ((memo["mem_available_mb"] - out["mem_available_after_mb"]) / max(1, n - out["failures"]))
    return out
