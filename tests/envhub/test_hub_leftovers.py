"""A publish or pull killed mid-way (kill -9, SIGTERM), on S3 (moto's server) and on a file
hub: no version listed broken, and nothing left once gc has run (issue #21). The killed
process is a real ``rockroll`` CLI run whose transfers are slowed (a slow network), so the
kill lands while the upload or download is in flight; each test checks that it did."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rockroll.envhub import HubStore, build, publish, pull
from rockroll.envhub.hubgc import hub_gc
from rockroll.envhub.manifest import LayerRef

BUCKET = "rockroll-hub"
BIG = 24 << 20  # random bytes in the package: one layer of 24 MiB, five 5 MiB parts
# The CLI as a user runs it, with every S3 part, file chunk and download chunk slowed.
SLOW_CLI = """
import sys, time
import rockroll.envhub.s3blobs as s3blobs, rockroll.envhub.store as store
store.CHUNK = 5 << 20
_part, _copy = s3blobs.S3Blobs._part, store._copy
s3blobs.S3Blobs._part = lambda *a: (time.sleep(a[4]), _part(*a))[1]  # part n after n s (sent in parallel)
def slow_copy(src, dst, bar):
    class Slow:
        def read(self, n):
            time.sleep(0.5)
            return src.read(1 << 20)
    return _copy(Slow(), dst, bar)
store._copy = slow_copy
from rockroll.cli import main
sys.argv[0] = "rockroll"
main()
"""


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    from _pkgs import make_pkg

    return build(make_pkg(tmp_path_factory.mktemp("pkg") / "counter")).manifest


def big_pkg(pkg) -> Path:
    folder = pkg(version="5.0.0", snapshots=False)
    (folder / "data" / "big.bin").write_bytes(os.urandom(BIG))
    return folder


def uploads(moto_s3, prefix: str) -> list[dict]:
    return moto_s3.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])


def parts_sent(moto_s3, prefix: str) -> int:
    """Parts of the uploads in flight. (moto reports every upload as started in 2010; an
    upload's parts carry their real times, and gc's grace goes by its newest part.)"""
    client = moto_s3.client()
    return sum(len(client.list_parts(Bucket=BUCKET, Key=u["Key"], UploadId=u["UploadId"]).get("Parts", []))
               for u in uploads(moto_s3, prefix))


def slow_cli(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SLOW_CLI, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env or os.environ)


def wait_for(cond, proc, what: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} never happened (exit {proc.poll()}): {proc.stderr.read() if proc.poll() else ''}")


def orphan_blob(store: HubStore, tmp_path: Path) -> LayerRef:
    """What a publisher killed after its first blob leaves: a blob no manifest names."""
    import hashlib

    data = os.urandom(1000)
    path = tmp_path / "orphan"
    path.write_bytes(data)
    layer = LayerRef("sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    store.put_blob(path, layer)
    return layer


def test_kill_9_mid_s3_publish_then_hub_gc(moto_s3, s3_hub, counter, pkg, tmp_path, cache):
    store = HubStore(s3_hub)
    publish(counter, store)
    orphan = orphan_blob(store, tmp_path)
    prefix = s3_hub.split("/", 3)[3] + "/"
    proc = slow_cli("hub", "publish", str(big_pkg(pkg)), "--hub", s3_hub)
    try:
        wait_for(lambda: parts_sent(moto_s3, prefix), proc, "a multipart upload's first part")
    finally:
        proc.kill()
        proc.wait()
    assert len(uploads(moto_s3, prefix)) == 1  # kill -9: nobody aborted it
    assert store.listing() == {"counter": {"1.0.0": False}}  # no broken version listed
    # within the grace period nothing is touched: it could be a publish in flight
    recent = hub_gc(store)
    assert (recent.removed, recent.aborted_uploads, recent.recent) == ([], [], [orphan.digest])
    dry = hub_gc(store, grace_s=0, dry_run=True)
    assert dry.removed == [orphan.digest] and len(dry.aborted_uploads) == 1
    assert store.has_blob(orphan) and len(uploads(moto_s3, prefix)) == 1  # a dry run deletes nothing
    gc = subprocess.run([sys.executable, "-m", "rockroll.cli", "hub", "gc", "--hub", s3_hub, "--grace", "0"],
                        capture_output=True, text=True, env=os.environ, timeout=120)
    assert gc.returncode == 0, gc.stderr
    assert "removed 1 unreferenced blob(s)" in gc.stdout and "aborted 1 multipart upload(s)" in gc.stdout
    assert not store.has_blob(orphan) and uploads(moto_s3, prefix) == []
    assert all(store.has_blob(b) for b in counter.blobs())  # what a manifest names stays
    assert pull("counter@1.0.0", hub=s3_hub, cache=cache).manifest == counter


def test_sigterm_mid_s3_publish_aborts_its_upload(moto_s3, s3_hub, pkg):
    prefix = s3_hub.split("/", 3)[3] + "/"
    folder = big_pkg(pkg)
    build(folder)  # built already: the CLI only publishes (no sandbox of a build handles SIGTERM for it)
    proc = slow_cli("hub", "publish", str(folder), "--hub", s3_hub)
    try:
        wait_for(lambda: uploads(moto_s3, prefix), proc, "a multipart upload")
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert uploads(moto_s3, prefix) == []  # aborted by the publisher itself, no gc needed
    assert HubStore(s3_hub).listing() == {}


def test_kill_9_mid_file_publish_and_pull_then_gc(file_hub, pkg, tmp_path):
    hub_dir = Path(file_hub[len("file://"):])
    blobs = hub_dir / "blobs" / "sha256"
    proc = slow_cli("hub", "publish", str(big_pkg(pkg)), "--hub", file_hub)
    try:
        wait_for(lambda: blobs.is_dir() and any(p.name.startswith(".") for p in blobs.iterdir()), proc,
                 "a blob temp file")
    finally:
        proc.kill()
        proc.wait()
    store = HubStore(file_hub)
    assert store.listing() == {}
    gc = subprocess.run([sys.executable, "-m", "rockroll.cli", "hub", "gc", "--hub", file_hub, "--grace", "0"],
                        capture_output=True, text=True, env=os.environ, timeout=120)
    assert gc.returncode == 0 and "removed 1 temp file(s)" in gc.stdout, gc.stdout + gc.stderr
    assert [p.name for p in blobs.iterdir() if p.name.startswith(".")] == []

    # the same package published whole, then a pull killed mid-download in another home
    done = subprocess.run([sys.executable, "-m", "rockroll.cli", "hub", "publish", str(big_pkg(pkg)),
                           "--hub", file_hub], capture_output=True, text=True, env=os.environ, timeout=300)
    assert done.returncode == 0, done.stderr
    home = tmp_path / "home"
    env = {**os.environ, "ROCKROLL_HOME": str(home)}
    store_dir = home / "snapshots" / "sha256"
    proc = slow_cli("hub", "pull", "counter@5.0.0", "--hub", file_hub, env=env)
    try:
        wait_for(lambda: store_dir.is_dir() and any(p.name.startswith(".pull-") for p in store_dir.iterdir()),
                 proc, "a download temp file")
    finally:
        proc.kill()
        proc.wait()
    gc = subprocess.run([sys.executable, "-m", "rockroll.cli", "hub", "gc"], capture_output=True, text=True,
                        env=env, timeout=120)
    assert gc.returncode == 0 and "removed 1 temp file(s)" in gc.stdout, gc.stdout + gc.stderr
    assert [p.name for p in store_dir.iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("broken", [b"{not json", b'{"schema": "other"}'])
def test_hub_gc_deletes_nothing_when_a_manifest_cannot_be_read(file_hub, counter, tmp_path, broken):
    store = HubStore(file_hub)
    publish(counter, store)
    orphan = orphan_blob(store, tmp_path)
    store.create(store.manifest_path("counter", "6.0.0"), broken)
    from rockroll.envhub.errors import HubError

    with pytest.raises(HubError, match="nothing deleted"):
        hub_gc(store, grace_s=0)
    assert store.has_blob(orphan)
