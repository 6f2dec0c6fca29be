"""Env benchmark: rock/SWE-v0 reset latency and stepping throughput, against a container
per episode driven through the Docker CLI (the gem-llm / SWE-ReX way), in the same run.

    .venv/bin/python bench/envs.py [--quick] [--envs 64] [--no-docker] [--hub URL]

1. reset: p50/p95 of ``env.reset()`` on one task whose warm pool holds sandboxes already at
   the task's state (target p50 <= 20 ms), against ``docker run -d`` of the same task's
   image exported to Docker (the start of a docker-per-episode env);
2. steps/s: N envs (default 64) in one ``make_vec`` (one asyncio loop) running a fixed
   4-command script per episode, against the same script on containers, one ``docker
   exec`` per command, N/8 episodes at a time in threads.

Needs the default SWE set on the default hub (``rockroll envs build-swe --default``), or on ``--hub``.
gem-llm itself is not run: its terminal env (gem-llm 0.1.0, gem/envs/terminal/docker_env.py)
drives terminal-bench tasks through docker compose, building per-task images from Dockerfiles
whose bases come from a registry this machine cannot reach; the docker CLI rows measure the
same design (a container per episode, one exec per command) with the same image.
Prints a table, writes bench/results/envs.json; removes every container and image it made.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, sigterm_as_exit, stats, write_json  # noqa: E402

import rockroll  # noqa: E402,F401
from rockroll.gem.swe import SWEEnv, hub_swe_tasks  # noqa: E402
from rockroll.gem.vector import GemVectorEnv  # noqa: E402

SCRIPT = ["git status --short | wc -l", "ls", "grep -rc 'def ' --include=*.py . | tail -n 3",
          "python3 -c 'import sys; print(sys.version_info[:2])'"]
COLUMNS = ("metric", "rockroll", "docker CLI", "ratio", "target", "met")
# What bench/results/envs.json holds (tests/test_bench_smoke.py checks every run against it):
# a list's rows by their first column, in order (a row's label starts with its name); a
# dict's keys, each measured (not None); "" is the top level.
PROMISED = {
    "rows": ("reset p50 (ms)", "reset p95 (ms)", "steps/s"),
    "reset_ms": ("median", "p95", "n"),
    "docker_start_ms": ("median", "p95", "n"),
    "": ("steps_per_s", "docker_steps_per_s"),
}


def bash(cmd: str) -> str:
    return f"```bash\n{cmd}\n```"


def bench_reset(task, n: int) -> list[float]:
    env = SWEEnv(tasks=[task], pool_size=4)
    try:
        env.reset(options={"task_id": task.id})
        time.sleep(1.0)  # the pool warms up in the background
        samples = []
        for _ in range(n):
            env.step(bash("echo work > scratch.txt"))
            time.sleep(0.05)  # as between episodes: the pool restores the sandbox just given back
            t = time.perf_counter()
            env.reset(options={"task_id": task.id})
            samples.append(time.perf_counter() - t)
        return samples
    finally:
        env.close()


def bench_vector(tasks, n_envs: int, rounds: int) -> tuple[float, int]:
    # every task's pool stays warm (the default keeps 8 idle task pools): resets acquire, not create
    envs = [SWEEnv(tasks=tasks, pool_size=n_envs, max_warm_pools=len(tasks)) for _ in range(n_envs)]
    vec = GemVectorEnv(envs, autoreset=False)
    try:
        vec.reset(seed=0)
        steps, t = 0, time.perf_counter()
        for r in range(rounds):
            if r:
                vec.reset(seed=r)
            for cmd in SCRIPT:
                vec.step([bash(cmd)] * n_envs)
                steps += n_envs
        return steps / (time.perf_counter() - t), steps
    finally:
        vec.close()


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check)


def docker_episode(image: str) -> tuple[float, int]:
    """One episode, docker-per-episode: run, one exec per command, remove. Returns (start s, steps)."""
    name = f"rockroll-bench-{uuid.uuid4().hex[:8]}"
    t = time.perf_counter()
    docker("run", "-d", "--network", "none", "--name", name, image, "sleep", "infinity")
    start = time.perf_counter() - t
    try:
        for cmd in SCRIPT:
            docker("exec", "-w", "/workspace", name, "bash", "-c", cmd)
        return start, len(SCRIPT)
    finally:
        docker("rm", "-f", name, check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    ap.add_argument("--envs", type=int, default=64, help="concurrent envs for the steps/s row")
    ap.add_argument("--no-docker", action="store_true", help="skip the docker CLI comparison")
    ap.add_argument("--hub", help="the hub holding the SWE set (default: the default hub)")
    args = ap.parse_args()
    sigterm_as_exit()
    tasks = hub_swe_tasks(args.hub)
    if not tasks:
        sys.exit(f"no SWE tasks on the hub {args.hub or '(default)'}: run `rockroll envs build-swe --default` first")
    resets = 30 if args.quick else 200
    rounds = 1 if args.quick else 3
    print(f"reset x{resets} (warm pool, one task)", file=sys.stderr)
    reset = stats(bench_reset(tasks[0], resets))
    print(f"{args.envs} envs x {rounds} episode(s) x {len(SCRIPT)} commands", file=sys.stderr)
    sps, steps = bench_vector(tasks, args.envs, rounds)

    d_start, d_sps = None, None
    if not args.no_docker:
        from rockroll.envhub.export import export_docker

        tag = f"rockroll/bench-swe:{uuid.uuid4().hex[:8]}"
        print(f"exporting {tasks[0].id} to docker as {tag}", file=sys.stderr)
        export_docker(tasks[0].image, tag, snapshot=tasks[0].snapshot)
        try:
            starts = [docker_episode(tag)[0] for _ in range(5 if args.quick else 20)]
            d_start = stats(starts)
            episodes = max(2, args.envs // 8) * rounds
            t = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(max(2, args.envs // 8)) as pool:
                done = list(pool.map(lambda _: docker_episode(tag)[1], range(episodes)))
            d_sps = sum(done) / (time.perf_counter() - t)
        finally:
            docker("rmi", "-f", tag, check=False)

    def ratio(a, b):
        return f"{a / b:.1f}x" if a and b else "-"

    rows = [
        {"metric": "reset p50 (ms)", "rockroll": f"{reset['median']:.2f}",
         "docker CLI": f"{d_start['median']:.0f}" if d_start else "-",
         "ratio": ratio(d_start and d_start["median"], reset["median"]), "target": "<= 20",
         "met": "yes" if reset["median"] <= 20 else "NO"},
        {"metric": "reset p95 (ms)", "rockroll": f"{reset['p95']:.2f}",
         "docker CLI": f"{d_start['p95']:.0f}" if d_start else "-", "ratio": ratio(d_start and d_start["p95"], reset["p95"]),
         "target": "", "met": ""},
        {"metric": f"steps/s, {args.envs} envs", "rockroll": f"{sps:.0f}", "docker CLI": f"{d_sps:.0f}" if d_sps else "-",
         "ratio": ratio(sps, d_sps), "target": "", "met": ""},
    ]
    print_table("rock/SWE-v0 vs a container per episode (docker CLI), same image, same run", rows, COLUMNS)
    write_json("envs", {"reset_ms": reset, "docker_start_ms": d_start, "steps_per_s": sps, "steps": steps,
                        "docker_steps_per_s": d_sps, "envs": args.envs, "script": SCRIPT, "rows": rows})


if __name__ == "__main__":
    main()
