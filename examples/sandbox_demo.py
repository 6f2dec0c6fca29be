"""The demo `make demo` runs: a sandbox on the embedded local backend (no daemon).

Opens a sandbox, runs commands in a persistent session, snapshots it, forks it,
restores it, and prints how long each step took.
"""

import time

from rockroll.sandbox import SandboxSpec, open_sandbox
from rockroll.sandbox.pool import SandboxPool


def timed(label, fn, timings):
    t = time.perf_counter()
    out = fn()
    timings.append((label, (time.perf_counter() - t) * 1000))
    return out


def main() -> None:
    timings: list[tuple[str, float]] = []
    spec = SandboxSpec(memory_mb=512, pids=256, cpus=1.0)
    sb = timed("create sandbox", lambda: open_sandbox(spec), timings)
    with sb:
        print(f"sandbox {sb.id}: isolated namespaces, overlayfs root, cgroup limits\n")
        r = timed("run (first command)", lambda: sb.run("uname -sr; id; hostname; ls /"), timings)
        print(r.stdout)
        timed("run('true')", lambda: sb.run("true"), timings)
        sb.run("mkdir -p /workspace/app && cd /workspace/app && export GREETING=hello")
        sb.write_file("app/main.py", "import os\nprint(os.environ['GREETING'], 'from the sandbox')\n")
        print("$ python3 main.py   # cwd and GREETING persist in the session")
        print(sb.run("python3 main.py").stdout)
        r = sb.run("python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 2)' 2>&1 | tail -1")
        print(f"network is off: {r.stdout.strip()}")
        r = sb.run("sleep 10", timeout=0.3)
        print(f"timeout kills the command, not the session: timed_out={r.timed_out}, "
              f"next: {sb.run('echo $GREETING').stdout.strip()}\n")

        snap = timed("snapshot", sb.snapshot, timings)
        print(f"snapshot {snap.id} ({snap.size} bytes, zstd, content-addressed)")
        forks = timed("fork x4", lambda: sb.fork(4), timings)
        for i, f in enumerate(forks):
            f.run(f"echo 'print(\"fork {i}\")' >> main.py")
        print("forks diverge copy-on-write:", [f.run("python3 main.py").stdout.split("\n")[1] for f in forks])
        for f in forks:
            f.close()
        sb.run("rm -rf /workspace/app")
        timed("restore", lambda: sb.restore(snap), timings)
        print("restored:", sb.run("python3 main.py").stdout.strip())
        timed("reset", sb.reset, timings)
        print("reset to the image:", repr(sb.run("ls -A /workspace").stdout), "\n")

    with SandboxPool(spec, size=2) as pool:
        box = timed("acquire from warm pool", pool.acquire, timings)
        pool.release(box)

    print(f"{'step':<26}{'ms':>10}")
    for label, ms in timings:
        print(f"{label:<26}{ms:>10.1f}")


if __name__ == "__main__":
    main()
