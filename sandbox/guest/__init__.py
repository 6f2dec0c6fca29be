"""The guest: pid 1 of a sandbox, and keeper of its bash sessions.

Standard library only: it runs as ``python -S -E guest/__main__.py`` (``MAIN``), forked
from a zygote (``deployment/process.py``), and imports everything before its root
changes. It speaks the protocol of ``protocol/frames.py`` on its stdin/stdout.

Host modules import from here only what the host must do the same way: the capability
set (``KEEP_CAPS``, docker grants the same), the layer's detached mount
(``LAYER_DIRS``, ``detached_layer``, ``detached_mount``, made by ``deployment/disk.py``).
This file imports nothing: the host reads ``MAIN`` without loading the guest.
"""

import os

MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")
