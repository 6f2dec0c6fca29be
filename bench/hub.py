"""Env hub benchmark: publish/pull throughput against a plain boto3 transfer of the same
bytes to the same S3 server (moto, a subprocess on 127.0.0.1), cached pull latency, and
sandbox cold start from a pulled env vs the host image.

The env holds ``--mb`` MiB of random (incompressible) bytes made by a setup step, so zstd
cannot shrink the transfer. Pull is timed twice: transfer + sha256 verification (the
part comparable with boto3's download_file) and the whole pull (plus unpacking the layer).
The package's env is rock/Math-v0's entry point (the build checks that it imports; the
benchmark never makes the env, it moves the package's bytes).

    .venv/bin/python bench/hub.py [--quick] [--mb 200] [--starts 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table, sigterm_as_exit, stats, write_json  # noqa: E402
from _services import MotoServer  # noqa: E402

BUCKET = "rockroll-bench"
# The throw-away package's env: a GEM env that takes the image gymnasium.make passes
BENCH_ENV = """from rockroll.gem.mathenv import MathEnv


class BenchEnv(MathEnv):
    def __init__(self, *, image=None, **kwargs):
        super().__init__(**kwargs)
"""
HUB_IMAGE = "hub:bench@1.0.0"
# What bench/results/hub.json holds (tests/test_bench_smoke.py checks every run against it):
# a list's rows by their first column, in order (a row's label starts with its name); a
# dict's keys, each measured (not None); "" is the top level.
PROMISED = {
    "transfer": ("publish (s3, verify + upload)", "pull: transfer + sha256", "pull: whole (+ unpack)"),
    "latency_ms": ("pull, fully cached (new process view)", "pull, memoised in-process",
                   "sandbox start, image=host", "sandbox start, image=hub:bench@1.0.0"),
    "rounds": ("boto3_up", "publish", "boto3_down", "fetch", "pull"),
    "": ("env_mib", "build_s"),
}


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 4 MiB, 1 round, 3 starts, 5 cached pulls (each may still be set)")
    ap.add_argument("--mb", type=int, help="MiB of random bytes in the env (default 200; --quick 4)")
    ap.add_argument("--starts", type=int, help="sandbox starts per image (default 10; --quick 3)")
    ap.add_argument("--rounds", type=int, help="boto3-then-ours rounds; medians reported (default 3; --quick 1)")
    args = ap.parse_args()
    for name, full, quick in (("mb", 200, 4), ("starts", 10, 3), ("rounds", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    cached_n = 5 if args.quick else 20
    sigterm_as_exit()
    work = Path(tempfile.mkdtemp(prefix="rockroll-bench-hub-"))
    os.environ["ROCKROLL_HOME"] = str(work / "home")
    for k, v in (("AWS_ACCESS_KEY_ID", "bench"), ("AWS_SECRET_ACCESS_KEY", "bench"), ("AWS_DEFAULT_REGION", "us-east-1")):
        os.environ.setdefault(k, v)
    import boto3

    import rockroll  # noqa: F401 - installs the hub image scheme
    from rockroll.envhub import HubStore, LocalCache, build, publish, pull
    from rockroll.envhub.pull import forget
    from rockroll.sandbox import SandboxSpec, open_sandbox

    moto = MotoServer()
    endpoint = moto.endpoint
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket=BUCKET)
        pkg = work / "pkg"
        pkg.mkdir()
        # the package ships its entry point, as a user's does (the build constructs it as
        # gymnasium.make will: it takes image=)
        (pkg / "python").mkdir()
        (pkg / "python" / "bench_env.py").write_text(BENCH_ENV)
        (pkg / "rockenv.toml").write_text(f'''name = "bench"
version = "1.0.0"
setup = ["head -c {args.mb}M /dev/urandom > /opt/blob"]
python = "python"
[env]
entry_point = "bench_env:BenchEnv"
''')
        print(f"building a {args.mb} MiB env...", file=sys.stderr)
        t = time.perf_counter()
        manifest = build(pkg).manifest
        build_s = time.perf_counter() - t
        layer = max(manifest.layers, key=lambda l: l.size)
        tarball = LocalCache().layers.tarball(layer.digest)
        total = sum(l.size for l in manifest.blobs())
        mb = total / 2**20

        # Rounds, each timing boto3 and ours back to back on the same bytes and server, so a
        # ratio compares runs under the same load (this machine is shared); medians reported.
        boto_up, boto_down, pub, fetch, whole = [], [], [], [], []
        for r in range(args.rounds):
            # boto3 baseline: the same bytes, the same server, default TransferConfig.
            t = time.perf_counter()
            s3.upload_file(str(tarball), BUCKET, f"baseline/{r}")
            boto_up.append(time.perf_counter() - t)
            store = HubStore(f"s3://{BUCKET}/hub{r}", endpoint=endpoint)
            rss0 = rss_mb()
            t = time.perf_counter()
            result = publish(manifest, store)
            pub.append(time.perf_counter() - t)
            if r == 0:  # the peak is per process: only the first round can raise it
                rss_pub = rss_mb() - rss0
            assert result.created
            t = time.perf_counter()
            s3.download_file(BUCKET, f"baseline/{r}", str(work / "baseline.bin"))
            boto_down.append(time.perf_counter() - t)
            (work / "baseline.bin").unlink()
            # Pull, part 1: transfer + verify only (what boto3's download_file does, plus
            # sha256, which get_blob computes as the bytes arrive).
            tmp = work / "fetch.part"
            t = time.perf_counter()
            assert store.get_blob(layer, tmp) == layer.digest
            fetch.append(time.perf_counter() - t)
            tmp.unlink()
            # Pull, part 2: the whole pull on a fresh machine (cache), unpacking included.
            fresh = LocalCache(work / f"home-pull{r}")
            rss0 = rss_mb()
            t = time.perf_counter()
            pull("bench@1", hub=store, cache=fresh)
            whole.append(time.perf_counter() - t)
            if r == 0:
                rss_pull = rss_mb() - rss0
            forget()

        # Cached pull: a new process' view (memo cleared), exact pin, everything local.
        cached = []
        for _ in range(cached_n):
            forget()
            t = time.perf_counter()
            pull("bench@1.0.0", hub=store, cache=fresh)
            cached.append(time.perf_counter() - t)
        memo = []
        for _ in range(cached_n):
            t = time.perf_counter()
            pull("bench@1.0.0", hub=store, cache=fresh)
            memo.append(time.perf_counter() - t)

        # Cold start: sandbox create (to a ready agent) + close, pulled env vs host.
        pull("bench@1.0.0", hub=store)  # into the default home the sandboxes use
        starts: dict[str, list[float]] = {}
        for image in ("host", HUB_IMAGE):
            with open_sandbox(SandboxSpec(image=image, memory_mb=256)):
                pass  # warm-up: host base layer, page cache
            starts[image] = []
            for _ in range(args.starts):
                t = time.perf_counter()
                sb = open_sandbox(SandboxSpec(image=image, memory_mb=256))
                starts[image].append(time.perf_counter() - t)
                sb.close()
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    med = statistics.median
    ratio = lambda base, ours: med(b / o for b, o in zip(base, ours))  # noqa: E731 - per round
    rows = [
        {"what": "publish (s3, verify + upload)", "MiB": mb, "seconds": med(pub), "MiB/s": mb / med(pub),
         "boto3 MiB/s": mb / med(boto_up), "ratio": ratio(boto_up, pub), "peak RSS +MiB": rss_pub},
        {"what": "pull: transfer + sha256", "MiB": mb, "seconds": med(fetch), "MiB/s": mb / med(fetch),
         "boto3 MiB/s": mb / med(boto_down), "ratio": ratio(boto_down, fetch)},
        {"what": "pull: whole (+ unpack)", "MiB": mb, "seconds": med(whole), "MiB/s": mb / med(whole),
         "boto3 MiB/s": mb / med(boto_down), "ratio": ratio(boto_down, whole), "peak RSS +MiB": rss_pull},
    ]
    print_table(f"Hub transfer, {mb:.0f} MiB of random bytes, moto S3 on 127.0.0.1, median of "
                f"{args.rounds} rounds (target ratio >= 0.8)",
                rows, ["what", "MiB", "seconds", "MiB/s", "boto3 MiB/s", "ratio", "peak RSS +MiB"])
    lat = [
        {"what": "pull, fully cached (new process view)", **stats(cached), "target ms": 50},
        {"what": "pull, memoised in-process", **stats(memo)},
        {"what": "sandbox start, image=host", **stats(starts["host"]), "target ms": 150},
        {"what": f"sandbox start, image={HUB_IMAGE}", **stats(starts[HUB_IMAGE]), "target ms": 150},
    ]
    print_table("Latency (ms)", lat, ["what", "median", "p95", "n", "target ms"])
    path = write_json("hub", {"params": {"mb": args.mb, "rounds": args.rounds, "starts": args.starts,
                                         "cached_pulls": cached_n, "quick": args.quick},
                              "env_mib": mb, "data": "random (incompressible)", "build_s": build_s,
                              "rounds": {"boto3_up": boto_up, "publish": pub, "boto3_down": boto_down,
                                         "fetch": fetch, "pull": whole},
                              "transfer": rows, "latency_ms": lat})
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
