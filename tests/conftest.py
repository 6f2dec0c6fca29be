"""Shared fixtures. Every test session gets its own ROCKROLL_HOME, so tests never touch
(or get confused by) a user's real sandboxes, and its own cgroup parent."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

_USER_ENV = dict(os.environ)  # before the test home: where the user's default hub is
_home = tempfile.mkdtemp(prefix="rockroll-test-home-")
os.environ.setdefault("ROCKROLL_HOME", _home)
os.environ.setdefault("ROCKROLL_CGROUP_PARENT", "rockroll-test")


@pytest.fixture(scope="session")
def swe_hub() -> str:
    """The hub holding the default SWE task set: the user's default hub, where `make test`
    and `make demo` publish it (`rockroll envs build-swe --default`). Built here if it is
    missing (minutes: a Debian base, three sdists, their test suites); a no-op otherwise.
    The tests read it through their own (empty) local cache."""
    rockroll = str(Path(sys.executable).parent / "rockroll")
    proc = subprocess.run([rockroll, "envs", "build-swe", "--default"], env=_USER_ENV,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"building the default SWE tasks failed:\n{proc.stderr[-3000:]}"
    url = subprocess.run([sys.executable, "-c", "from rockroll.envhub.store import default_hub_url as u; print(u())"],
                         env=_USER_ENV, capture_output=True, text=True, check=True).stdout.strip()
    return url
