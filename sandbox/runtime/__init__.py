"""Clients that talk to one sandbox: ``guest.py`` (our guest, local and docker),
``remote.py`` (the HTTP SDK), ``ray.py`` and ``ray_pool.py`` (sandboxes on Ray nodes). The
guest itself, pid 1 of a sandbox, is ``guest/``."""
