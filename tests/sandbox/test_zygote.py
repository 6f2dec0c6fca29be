"""The fork server (``guest/zygote.py``): every guest is a fork of one long-lived process of
the owner's, so what that process holds is what a sandbox could inherit. Read from the
host: the guests' parent, their fds, environment and cgroup, and the zygote's memory.
(That the zygote dies with its owner is in test_faults.py's kill -9 test.)"""

import json
import os
import re
import uuid
from pathlib import Path

from rockroll.sandbox import SandboxSpec, open_sandbox
from rockroll.sandbox.deployment.process import zygote_pid
from rockroll.sandbox.deployment.reaper import current_run


def guest_pids(sb) -> tuple[int, int]:
    info = json.loads((current_run().dir / sb.id / "guest.json").read_text())
    return info["outer_pid"], info["init_pid"]


def parent_of(pid: int) -> int:
    data = Path(f"/proc/{pid}/stat").read_text()
    return int(data[data.rindex(")") + 2:].split()[1])


def fd_targets(pid: int) -> list[str]:
    folder = Path(f"/proc/{pid}/fd")
    out = []
    for fd in folder.iterdir():
        try:
            out.append(os.readlink(fd))
        except OSError:
            pass  # closed meanwhile
    return out


def memory_holds(pid: int, needle: bytes) -> bool:
    """Whether any readable, writable mapping of ``pid`` holds ``needle`` (read as root
    through /proc/<pid>/mem: non-dumpable processes too)."""
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (r)w", line)
            if not m:
                continue
            start, end = int(m[1], 16), int(m[2], 16)
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except OSError:
                continue  # a guard page, a mapping gone meanwhile
    return False


def ns_of(pid: int, kind: str) -> str:
    return os.readlink(f"/proc/{pid}/ns/{kind}")


def test_agents_are_forked_by_the_zygote():
    with open_sandbox(SandboxSpec(memory_mb=128, pids=64)) as sb:
        outer, init = guest_pids(sb)
        zygote = zygote_pid()
        # as root, one process: the zygote forked it as pid 1 of a pid namespace of its own
        assert zygote is not None and outer == init and parent_of(init) == zygote
        assert ns_of(init, "pid") != ns_of(zygote, "pid")
        # and the zygote went back to its own: the next guest gets a namespace of its own too
        assert ns_of(zygote, "pid_for_children") == ns_of(zygote, "pid")
        with open_sandbox(SandboxSpec(memory_mb=128, pids=64)) as other:
            _, other_init = guest_pids(other)
            assert ns_of(other_init, "pid") not in (ns_of(init, "pid"), ns_of(zygote, "pid"))
        # the zygote is ours, not a sandbox's: in our cgroup, with an empty environment
        assert Path(f"/proc/{zygote}/cgroup").read_text() == Path("/proc/self/cgroup").read_text()
        assert Path(f"/proc/{zygote}/environ").read_bytes() == b""
        assert sb.run("true").ok


def test_a_second_sandbox_inherits_nothing_of_the_first():
    secret = f"rr-secret-{uuid.uuid4().hex}"
    with open_sandbox(SandboxSpec(memory_mb=128, pids=64, env={"RR_PLANTED": secret})) as first:
        assert first.run("echo $RR_PLANTED").stdout == secret + "\n"
        first_outer, first_init = guest_pids(first)
        first_pipes = {t for pid in (first_outer, first_init) for t in fd_targets(pid) if t.startswith("pipe:")}
        with open_sandbox(SandboxSpec(memory_mb=128, pids=64)) as second:
            assert second.run("echo ${RR_PLANTED:-unset}").stdout == "unset\n"
            outer, init = guest_pids(second)
            zygote = zygote_pid()
            # the zygote never saw the first sandbox's configuration, so neither it nor
            # anything forked from it holds its secret
            for pid in (zygote, outer, init):
                assert not memory_holds(pid, secret.encode()), pid
            assert memory_holds(first_init, secret.encode())  # the check can see one
            # fds: init only its own pipes, /dev/null and its selector; nothing of the first
            # sandbox or the zygote (an outer process, where there is one, keeps none)
            theirs = fd_targets(outer) + fd_targets(init)
            assert not first_pipes & set(theirs)
            assert not [t for t in theirs if t.startswith("socket:")]
            if outer != init:
                assert [t for t in fd_targets(outer) if not t.startswith("/dev/null")] == []
            # environment: empty (sessions get theirs from the config); cgroup: its own
            assert Path(f"/proc/{init}/environ").read_bytes() == b""
            cgroup = Path(f"/proc/{init}/cgroup").read_text()
            assert second.id in cgroup and first.id not in cgroup
            assert Path(f"/proc/{zygote}/cgroup").read_text() != cgroup
