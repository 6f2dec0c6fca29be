"""Helpers every benchmark shares: timing stats, a markdown table, JSON results.

Benchmarks print a table on stdout (progress goes to stderr) and write
``bench/results/<name>.json`` with the host they ran on, because absolute times on
shared machines drift and a number means little without its host.
``ROCKROLL_BENCH_RESULTS=DIR`` writes them to DIR instead (the smoke tests do, so a test
run never overwrites a real run's results).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def stats(samples: Sequence[float]) -> dict[str, float | int | None]:
    """Median and 95th percentile of ``samples`` (seconds), in milliseconds.

    p95 is nearest-rank (an observed sample, never an interpolation), which is the
    honest choice for the small sample counts of a ``--quick`` run.
    """
    if not samples:
        return {"median": None, "p95": None, "n": 0}
    ordered = sorted(samples)
    rank = max(1, -(-95 * len(ordered) // 100))  # ceil(0.95 n), 1-based
    return {"median": statistics.median(ordered) * 1e3, "p95": ordered[rank - 1] * 1e3,
            "n": len(ordered)}


def percentiles(samples: Sequence[float], *qs: int) -> dict[str, float | int | None]:
    """Nearest-rank percentiles of ``samples`` (seconds) in milliseconds, keyed ``p50``,
    ``p99``...; plus ``max`` and ``n``. Each value is an observed sample."""
    ordered = sorted(samples)
    out: dict[str, float | int | None] = {}
    for q in qs:
        rank = max(1, -(-q * len(ordered) // 100))  # ceil(q n / 100), 1-based
        out[f"p{q}"] = ordered[rank - 1] * 1e3 if ordered else None
    out["max"] = ordered[-1] * 1e3 if ordered else None
    out["n"] = len(ordered)
    return out


def log(msg: str) -> None:
    """A benchmark's progress line, on stderr (stdout is its table)."""
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def mem_available_mb() -> int:
    """``MemAvailable`` from /proc/meminfo (what ``free -m`` shows as available), in MiB."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _stat_fields(pid: int) -> list[str]:
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    return data[data.rindex(")") + 2:].split()


def children_map() -> dict[int, list[int]]:
    """Every process's children (``ppid -> [pid]``), read from /proc once."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                kids.setdefault(int(_stat_fields(int(name))[1]), []).append(int(name))
            except (OSError, IndexError, ValueError):
                continue  # exited meanwhile
    return kids


def descendants(pid: int, kids: dict[int, list[int]] | None = None) -> list[int]:
    """``pid`` and every live process below it."""
    kids = children_map() if kids is None else kids
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and everything it started: the live
    processes below it, and (through the kernel's cutime/cstime) the ones already reaped."""
    return sum(_proc_cpu_s(p) for p in descendants(pid))


def _proc_cpu_s(pid: int) -> float:
    """One process's CPU seconds, its reaped children's included. ``/proc/PID/stat``
    rounds each process's total down to a clock tick (10 ms): a thousand agents that ran
    7 ms each read as 0. So the exact run time of its live threads (``schedstat``, in ns)
    where that is more (it misses only threads that already exited, which ``stat`` has)."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = _stat_fields(pid)
        own, reaped = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
    except (OSError, IndexError, ValueError):
        return 0.0  # exited meanwhile
    exact = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                exact += int(f.read().split()[0])
    return max(own / tick, exact / 1e9) + reaped / tick


def pss_kb(pid: int) -> int:
    """Proportional set size of ``pid`` (``/proc/PID/smaps_rollup``), in KiB; 0 if gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def swap_used_mb() -> int:
    """SwapTotal - SwapFree from /proc/meminfo, in MiB."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            info[key] = int(value.split()[0])
    return (info.get("SwapTotal", 0) - info.get("SwapFree", 0)) // 1024


def sigterm_as_exit() -> None:
    """Make SIGTERM unwind like Ctrl-C (``finally`` blocks run: servers, clusters and
    containers a benchmark started get stopped) instead of killing the process cold."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


@contextlib.contextmanager
def timer() -> Iterator[list[float]]:
    """``with timer() as t: ...`` then ``t[0]`` is the elapsed seconds."""
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


def fmt(value: Any, digits: int = 2) -> str:
    """A table cell: floats rounded, None as '-', booleans as yes/NO, the rest as text."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def render_table(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """A markdown table (pipes, header rule) whose columns are also aligned as plain text."""
    cells = [[fmt(row.get(col)) for col in columns] for row in rows]
    widths = [max([len(col)] + [len(r[i]) for r in cells]) for i, col in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(columns), rule] + [line(r) for r in cells])


def print_table(title: str, rows: list[dict], columns: Sequence[str]) -> None:
    """Print ``title`` and the table of ``rows`` (dicts keyed by column name) to stdout."""
    print(f"\n{title}\n")
    print(render_table(rows, columns))
    sys.stdout.flush()


def run_arm(script: str, name: str, argv: list[str], python: str = sys.executable) -> dict:
    """One arm of a benchmark in a fresh process (``python script argv...``; ``python``: another
    venv's interpreter), so its memory and threads are its own: the JSON object its last line of
    stdout prints. Exits with the arm's stderr when it fails."""
    out = subprocess.run([python, script, *argv], capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def host_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def results_dir() -> Path:
    """Where results go: ``$ROCKROLL_BENCH_RESULTS`` if set, else ``bench/results/``."""
    return Path(os.environ.get("ROCKROLL_BENCH_RESULTS") or RESULTS_DIR)


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """Write ``<results_dir()>/<name>.json`` with ``host`` info added; return its path."""
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"host": host_info(), **payload}, indent=2, default=str) + "\n")
    tmp.replace(path)  # a reader never sees a half-written result
    return path


def progress(iterable: Iterable, desc: str, total: int | None = None):
    """A tqdm bar on stderr (stdout stays a clean table); vanishes when done."""
    from tqdm import tqdm

    # disable=None: tqdm turns itself off when stderr is not a terminal (CI logs).
    return tqdm(iterable, desc=desc, total=total, file=sys.stderr, leave=False, disable=None)
