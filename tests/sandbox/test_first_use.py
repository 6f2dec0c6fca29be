"""Caches built on first use under the state home (the host image's base layer, a disk
size's ext4 template) are built once when a burst of creates finds them missing: the
others wait for that one build. (Each of a burst's deployment threads used to build its
own: 200 creates at once on a fresh home took 40 s instead of 3.)"""

from __future__ import annotations

import collections
import concurrent.futures
import threading

from rockroll.sandbox.deployment import disk, rootfs


def test_a_burst_on_a_fresh_home_builds_each_cache_once(tmp_path, monkeypatch):
    builds: collections.Counter[str] = collections.Counter()

    def counted(name, build):
        def wrapper(*args, **kwargs):
            builds[name] += 1
            return build(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(rootfs, "_build_host_layer", counted("host layer", rootfs._build_host_layer))
    monkeypatch.setattr(rootfs, "_etc_fingerprint", counted("walk of /etc", rootfs._etc_fingerprint))
    monkeypatch.setattr(disk, "_format_template", counted("ext4 template", disk._format_template))
    start = threading.Barrier(16)

    def create(_):
        start.wait()  # all at once, as a burst's deployment threads
        return rootfs.host_base_layer(tmp_path), disk.ext4_template(64, tmp_path)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        made = set(pool.map(create, range(16)))
    assert builds == {"host layer": 1, "walk of /etc": 1, "ext4 template": 1}
    (layer, template), = made
    assert (layer / "etc").is_dir() and template.stat().st_size == 64 << 20
    assert sorted(p.name for p in layer.parent.iterdir()) == [layer.name]  # no half-built copy left
