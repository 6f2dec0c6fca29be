"""The guest: pid 1 of a sandbox, and keeper of its bash sessions.

Standard library only: it runs as ``python -S -E guest/__main__.py`` (``MAIN``), forked
from a zygote (``deployment/process.py``), and imports everything before its root
changes. It speaks the protocol of ``protocol/frames.py`` on its stdin/stdout.

Host modules import from here only what the host must do the same way: the capability
set (``KEEP_CAPS``, docker grants the same), the layer's detached mount
(``LAYER_DIRS``, ``detached_layer``, ``detached_mount``, made by ``deployment/disk.py``).
This file imports nothing: the host reads ``MAIN`` without loading the guest.

Rooms: ``main.py`` (config frame to serving), ``zygote.py`` (the fork server),
``serve.py`` (the request loop), ``sessions.py`` (+ ``session.bash``, ``session.sh``),
``files.py``, ``model.py`` (the model channel), ``rootfs.py``, ``layers.py`` (the sized
writable layer), ``syscalls.py`` (libc, capabilities, the syscall filter).

Lifecycle
1. (host namespaces) join the sandbox's cgroups, apply rlimits, unshare mount/uts/ipc/net
   (and user, when not root), mount the sized writable layer (``disk_mb``,
   ``mount_layer``). The guest is pid 1 of a new pid namespace: when it dies, the kernel
   kills every process of the sandbox, so nothing can outlive it.
2. (init) build the root: overlayfs of the image layers and a private upper dir,
   read-only binds, a private /dev and /proc; ``pivot_root`` into it; bring up
   loopback; drop capabilities to Docker's default set and set no_new_privs; install
   the syscall filter (config key ``seccomp``, see ``deployment/seccomp.py``), which
   every process of the sandbox inherits.
3. (init) serve framed requests until stdin closes (the host died or closed us).

One process or two. As root the zygote forks the guest as pid 1 of a pid namespace of
its own (request ``p``, ``zygote``), and one process does 1 and 2: a single fork per
sandbox, and the setup's pages are copied from the zygote once. Otherwise (a user
namespace: an unprivileged zygote cannot make a pid namespace without one of its own,
which every sandbox would then share) an *outer* process does 1, unsharing the pid
namespace too, and stays in the layer; it forks init (2, 3), reports init's host pid
(``spawned``) and waits for it. ``ready`` says ``one_process`` in the first case.

Enter mode (the docker backend, config key ``enter_pid``): instead of unsharing, the
outer process joins the cgroups and the ipc/uts/net/pid/mnt namespaces of a running
container's pid 1 with ``setns(2)``; its child is then a process of the container (not
its pid 1: the container's keep-alive is), drops capabilities as above, builds a root
only for a disk limit (an overlay of the container's root and the sized layer,
``layer_root``), and installs the filter as above. The image needs no Python: the guest
brought everything it needs from the host.
"""

import os

MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
