"""Where sandboxes run: ``local.py`` (namespaces + overlayfs), ``docker.py``, ``ray.py``
(host actors and placement), with the shared agent process (``process.py``), cgroups,
root filesystems, images, the syscall filter (``seccomp.py``) and crash reaping
(``reaper.py``)."""
