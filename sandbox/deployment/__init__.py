"""Where sandboxes run: ``local.py`` (namespaces + overlayfs), ``docker.py``, ``ray.py``
(host actors and placement; their pool is ``runtime/ray_pool.py``), with the shared guest process (``process.py``), cgroups,
root filesystems, images, the syscall filter (``seccomp.py``) and crash reaping
(``reaper.py``)."""
