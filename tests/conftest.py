"""Shared fixtures. Every test session gets its own ROCKROLL_HOME, so tests never touch
(or get confused by) a user's real sandboxes, and its own cgroup parent."""

import os
import tempfile

_home = tempfile.mkdtemp(prefix="rockroll-test-home-")
os.environ.setdefault("ROCKROLL_HOME", _home)
os.environ.setdefault("ROCKROLL_CGROUP_PARENT", "rockroll-test")
