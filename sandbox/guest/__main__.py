"""Start the guest: ``python -S -E <this file>`` (a guest that waits for its config
frame) or ``... zygote`` (the fork server, ``deployment/process.py``).

Without ``site`` (``-S``) rockroll is not importable by name, and importing it would run
the host's package ``__init__`` files (pydantic, asyncio, ...). So the two parent packages
are registered here as empty namespaces over their folders: ``rockroll.sandbox.guest`` and
``rockroll.sandbox.protocol`` then import as on the host, and nothing else of rockroll
loads."""

import os
import sys

if __name__ == "__main__":
    _sandbox = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    del sys.path[0]  # this folder: its modules are the package's, not top-level names
    for _name, _path in (("rockroll", []), ("rockroll.sandbox", [_sandbox])):
        if _name not in sys.modules:
            _module = type(sys)(_name)
            _module.__path__ = _path
            sys.modules[_name] = _module
    from rockroll.sandbox.guest.main import main
    from rockroll.sandbox.guest.zygote import zygote

    zygote() if sys.argv[1:] == ["zygote"] else main()
