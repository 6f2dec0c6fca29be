"""Where rockroll keeps its host state: one root that deployments (run registry, images)
and storage (snapshots) both write under, so it lives apart from either.

The home is private, as Docker keeps its data root: mode 0700, so no other local user
reaches the layers, images, snapshots, hub cache or the sandboxes' upper dirs under it
(files there belong to sandbox users, may be setuid in a running sandbox's upper dir, and
hold whatever an env author or an agent put there). 0711 is needed nowhere: every mount
of a layer is made by the home's owner (root, or the user itself in its own user
namespace) before a sandbox's processes run, and Docker's daemon reads as root.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

def state_home() -> Path:
    """Root of rockroll's host state (``$ROCKROLL_HOME``, else a per-user default),
    created private (see ``private_home``)."""
    env = os.environ.get("ROCKROLL_HOME")
    if env:
        home = Path(env)
    elif os.geteuid() == 0:
        home = Path("/var/lib/rockroll")
    else:
        base = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
        home = Path(base) / "rockroll"
    return private_home(home)


def private_home(home: Path) -> Path:
    """Create ``home`` with mode 0700, or repair one that an older install left open to
    other users: then its folders are closed too (a user may hold one open already) and
    the setuid/setgid bits older versions unpacked into ``layers/`` are dropped. A home
    owned by another user is left as it is (only root could repair it). Returns ``home``."""
    home = Path(home)
    try:
        home.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        pass
    except OSError:
        return home  # unwritable: whatever writes here later reports it
    st = os.stat(home)
    if st.st_mode & 0o077 and (st.st_uid == os.geteuid() or os.geteuid() == 0):
        os.chmod(home, 0o700)
        for child in home.iterdir():
            if child.is_dir() and not child.is_symlink():
                os.chmod(child, 0o700)
        if (home / "layers").is_dir():
            # find never follows links (-P); ! -type l keeps chmod off them.
            subprocess.run(["find", str(home / "layers"), "-perm", "/6000", "!", "-type", "l",
                            "-exec", "chmod", "ug-s", "--", "{}", "+"], capture_output=True)
    return home


_first_use: dict[Path, threading.Lock] = {}
_first_use_guard = threading.Lock()


def first_use_lock(path: Path) -> threading.Lock:
    """The lock of a cache under the home that is built on first use (the host image's
    base layer, a disk template): the first of many creates started at once builds it,
    the others wait for it. Without it, each of a burst's deployment threads built a copy
    of its own (64 copies of /etc: 200 creates at once on a fresh home took 40 s instead
    of 3). Other processes still race: the builders rename into place atomically."""
    with _first_use_guard:
        return _first_use.setdefault(Path(path), threading.Lock())
