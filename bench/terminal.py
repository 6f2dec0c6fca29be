"""Terminal benchmark: keystroke-to-echo latency through each backend's terminal and the
service's WebSocket, against `docker exec -it` driven the same way, in the same run.

    .venv/bin/python bench/terminal.py [--quick] [--n 200]

Each sample types one key into `cat` running on a terminal and waits until its echo (the
terminal driver's) comes back: local (our guest), docker (our guest in the container),
remote (the SDK over `rockroll serve`'s WebSocket, local backend behind), ray (a one-node
cluster on 127.0.0.1: the node's host actor), and `docker exec -it <container> cat` on a
pseudo-terminal of this process (the Docker CLI's terminal path).
Prints a table (stdout; progress on stderr) and writes bench/results/terminal.json. The
service and the Ray cluster are started and stopped here; every sandbox and container is closed or removed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import select
import subprocess
import sys
import time
import tty
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, progress, sigterm_as_exit, stats, write_json  # noqa: E402
from _services import RayCluster, Service  # noqa: E402

from rockroll.sandbox import AsyncSandbox, SandboxSpec  # noqa: E402
from rockroll.sandbox.runtime.remote import Endpoint, RemoteSandbox  # noqa: E402

COLUMNS = ("path", "median (ms)", "p95 (ms)", "docker exec -it (ms)", "ratio (docker/ours)")
# What bench/results/terminal.json holds (tests/test_bench_smoke.py checks every run against it).
PROMISED = {
    "results": ("local", "docker", "remote", "ray", "docker_exec_it"),
    "rows": ("local", "docker", "remote", "ray"),
}


async def ours(sb: AsyncSandbox, n: int, desc: str) -> list[float]:
    """Key-to-echo through an ``AsyncTerminal`` on ``cat``."""
    samples = []
    async with await sb.open_terminal(["cat"]) as t:
        for i in progress(range(n), desc):
            key = b"abcdefghij"[i % 10:i % 10 + 1]
            start = time.perf_counter()
            await t.write(key)
            seen = b""
            while key not in seen:
                seen += await t.read_bytes() or b""
            samples.append(time.perf_counter() - start)
    return samples


def docker_exec_it(container: str, n: int) -> list[float]:
    """Key-to-echo through ``docker exec -it <container> cat`` on a pty of ours."""
    master, slave = os.openpty()
    tty.setraw(slave)  # no echo of our own: every echo is the container terminal's, as docker makes it
    proc = subprocess.Popen(["docker", "exec", "-it", container, "cat"], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True)
    os.close(slave)
    try:
        def echo_of(key: bytes, timeout: float = 30.0) -> None:
            seen, deadline = b"", time.monotonic() + timeout
            while key not in seen:
                if not select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    raise TimeoutError(f"no echo from docker exec -it: {seen!r}")
                seen += os.read(master, 4096)

        os.write(master, b"w")  # the exec is up once its echo comes
        echo_of(b"w", 60.0)
        samples = []
        for i in progress(range(n), "docker exec -it"):
            key = b"abcdefghij"[i % 10:i % 10 + 1]
            start = time.perf_counter()
            os.write(master, key)
            echo_of(key)
            samples.append(time.perf_counter() - start)
        return samples
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


async def measure(n: int, image: str, svc: Service) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    async with await AsyncSandbox.create(SandboxSpec(timeout_s=60)) as sb:
        out["local"] = await ours(sb, n, "local")
    async with await AsyncSandbox.create(SandboxSpec(backend="docker", image=image, timeout_s=60)) as sb:
        out["docker"] = await ours(sb, n, "docker")
    remote = await RemoteSandbox.open(SandboxSpec(backend="remote", timeout_s=60), url=svc.url, token=svc.token)
    async with remote:
        out["remote"] = await ours(remote, n, "remote (WebSocket)")
    return out


def measure_ray(n: int) -> list[float]:
    """Through a one-node Ray cluster on 127.0.0.1 (the node's host actor holds the terminal)."""
    import ray  # noqa: PLC0415 - the ray extra

    from rockroll.sandbox import open_sandbox  # noqa: PLC0415
    from rockroll.sandbox.deployment import ray as raycluster  # noqa: PLC0415
    from rockroll.sandbox.sync import run_sync  # noqa: PLC0415

    cluster = RayCluster(1)
    try:
        raycluster.connect(cluster.address)
        with open_sandbox(SandboxSpec(backend="ray", timeout_s=60)) as sb:
            return run_sync(ours(sb.aio, n, "ray"))
    finally:
        ray.shutdown()
        cluster.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="50 keys a path")
    parser.add_argument("--n", type=int, default=None, help="keys a path (default 300, --quick 50)")
    args = parser.parse_args()
    n = args.n or (50 if args.quick else 300)
    sigterm_as_exit()
    from rockroll.sandbox.deployment.images import ensure_docker_image  # noqa: PLC0415 - docker extra

    image = ensure_docker_image()
    container = subprocess.run(["docker", "run", "-d", "--rm", "--network", "none", image, "sleep", "infinity"],
                               capture_output=True, text=True, check=True).stdout.strip()
    svc = Service()
    try:
        samples = asyncio.run(measure(n, image, svc))
        samples["ray"] = measure_ray(n)
        samples["docker_exec_it"] = docker_exec_it(container, n)
    finally:
        svc.stop()
        subprocess.run(["docker", "rm", "-f", container], capture_output=True)
    results = {name: stats(s) for name, s in samples.items()}
    cli = results["docker_exec_it"]
    rows = []
    for name in ("local", "docker", "remote", "ray"):
        r = results[name]
        rows.append({"path": name, "median (ms)": r["median"], "p95 (ms)": r["p95"],
                     "docker exec -it (ms)": cli["median"],
                     "ratio (docker/ours)": round(cli["median"] / r["median"], 2) if r["median"] else None})
    print_table(f"keystroke-to-echo, {n} keys a path (same run)", rows, COLUMNS)
    path = write_json("terminal", {"n": n, "results": results, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
