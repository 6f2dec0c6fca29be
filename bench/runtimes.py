"""verifiers' runtimes: a box's whole life -- create, one exec, close -- through rockroll's
``RockrollRuntime`` (``rockroll.integrations.verifiers``) against verifiers' own subprocess
runtime, and its Docker runtime when a Docker engine answers.

Each arm is driven the way verifiers drives a runtime (``verifiers.v1.runtimes``:
``start()``, ``run(argv, env)``, ``stop()``), with the same ``echo`` exec; the arms take turns,
one box at a time, so drift on a shared machine hits all of them alike. Rows: the median and
p95 of the whole life, and the median of each phase; ratios against the subprocess runtime
(which isolates nothing: a host directory and a host process; it is the floor).

    python bench/runtimes.py [--quick] [--n 30] [--backend local]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, sigterm_as_exit, stats, write_json  # noqa: E402

from rockroll.sandbox import SandboxSpec  # noqa: E402

# What bench/results/runtimes.json holds (tests/test_bench_smoke.py checks every run against it):
# a list's rows by their first column, in order (a row's label starts with its name; the docker
# row is there measured or not, its note saying why not); a
# dict's keys, each measured (not None); "" is the top level.
PROMISED = {"rows": ("rockroll", "verifiers subprocess", "verifiers docker"), "": ("rockroll_vs_subprocess",)}
ARGV = ["sh", "-c", "echo hi"]


def docker_reachable() -> str | None:
    """None if a Docker engine answers, else why not (said in the table)."""
    if shutil.which("docker") is None:
        return "no docker CLI"
    out = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    return None if out.returncode == 0 else "no Docker engine reachable: " + (out.stderr.strip().splitlines() or ["?"])[-1]


async def life(make) -> dict[str, float]:
    """One box: start, one exec, stop; seconds per phase."""
    runtime = make()
    t0 = time.perf_counter()
    try:
        await runtime.start()
        t1 = time.perf_counter()
        result = await runtime.run(ARGV, {})
        t2 = time.perf_counter()
    finally:
        await runtime.stop()
    t3 = time.perf_counter()
    assert result.exit_code == 0 and result.stdout.strip() == "hi", result
    return {"start": t1 - t0, "exec": t2 - t1, "stop": t3 - t2, "total": t3 - t0}


def _why(e: Exception) -> str:
    """An arm's failure in a table cell: its type and the first line of its message."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:120]


async def run(args) -> dict:
    from verifiers.v1.runtimes import DockerConfig, DockerRuntime, SubprocessConfig, SubprocessRuntime

    from rockroll.integrations.verifiers import RockrollRuntime

    spec = SandboxSpec(backend=args.backend)
    arms = {f"rockroll ({args.backend})": lambda: RockrollRuntime(spec),
            "verifiers subprocess": lambda: SubprocessRuntime(SubprocessConfig())}
    docker_why = docker_reachable()
    if docker_why is None:
        # the Debian image rockroll's docker backend runs (no registry is needed to have it)
        from rockroll.sandbox.deployment.docker import resolve_image

        image = args.docker_image or resolve_image("host")
        arms["verifiers docker"] = lambda: DockerRuntime(DockerConfig(image=image))
    samples: dict[str, list[dict]] = {name: [] for name in arms}
    failed: dict[str, str] = {}
    for name, make in arms.items():  # warm-up, not measured: imports, first sandbox's one-time setup
        try:
            await life(make)
        except Exception as e:  # noqa: BLE001 - an arm that cannot run says why in its row
            failed[name] = _why(e)
    for _ in range(args.n):
        for name, make in arms.items():
            if name in failed:
                continue
            try:
                samples[name].append(await life(make))
            except Exception as e:  # noqa: BLE001 - an arm that cannot run says why in its row
                failed[name] = _why(e)
    rows = []
    for name in arms:
        got = samples[name]
        total = stats([s["total"] for s in got])
        rows.append({"runtime": name, "median": total["median"], "p95": total["p95"], "n": total["n"],
                     **{f"{phase}_ms": stats([s[phase] for s in got])["median"] for phase in ("start", "exec", "stop")},
                     "note": failed.get(name, "")})
    if docker_why is not None:
        rows.append({"runtime": "verifiers docker", "n": 0, "note": f"not measured ({docker_why})"})
    floor = rows[1]["median"]
    for row in rows:
        row["ratio"] = row["median"] / floor if row.get("median") and floor else None
    return {"rows": rows, "rockroll_vs_subprocess": rows[0]["ratio"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="5 boxes an arm (a smoke run)")
    ap.add_argument("--n", type=int, help="boxes an arm (default 30; --quick 5)")
    ap.add_argument("--backend", default="local", help="rockroll's backend: local, docker, remote, ray")
    ap.add_argument("--docker-image", help="verifiers' docker runtime image (default: rockroll's Debian image)")
    args = ap.parse_args()
    args.n = args.n or (5 if args.quick else 30)
    sigterm_as_exit()
    result = asyncio.run(run(args))
    print_table(f"create + one exec + close, one box at a time, {args.n} boxes an arm "
                "(ms; ratio against verifiers' subprocess runtime, which isolates nothing)",
                result["rows"], ["runtime", "median", "p95", "n", "start_ms", "exec_ms", "stop_ms", "ratio", "note"])
    path = write_json("runtimes", {"params": {"n": args.n, "backend": args.backend, "quick": args.quick}, **result})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
