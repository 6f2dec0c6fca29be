"""Shared fixtures. Every test session gets its own ROCKROLL_HOME, so tests never touch
(or get confused by) a user's real sandboxes, and its own cgroup parent."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The checkout's root holds the folder gem/ (installed as rockroll.gem). `python -m pytest` puts
# the root first on sys.path, where that folder would shadow gem-llm's top-level `gem` package
# (tests/gem/test_gemllm.py uses the real one). Nothing imports from the root itself: rockroll
# comes from the editable install, test helpers from their own folders (pytest's rootdir-less
# "prepend" import mode puts each test file's folder on sys.path).
_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or os.curdir).resolve() != _ROOT]

# A sandbox with network=True adds a veth and filter rules to the namespace it is made in:
# tests make theirs only in network namespaces they create (tests/sandbox/_netlab.py), never
# in the one the suite started in (the machine's own), builds of the user's SWE images included.
os.environ.setdefault("ROCKROLL_SANDBOX_NETWORK_GUARD", os.readlink("/proc/self/ns/net"))
# So the builds that install from the real package indexes (the SWE base, the agent images)
# share the suite's network instead (envhub/build.py); the lab's build test uses the allow-list.
os.environ.setdefault("ROCKROLL_BUILD_NETWORK", "host")
_USER_ENV = dict(os.environ)  # before the test home: where the user's default hub is
_home = tempfile.mkdtemp(prefix="rockroll-test-home-")
os.environ.setdefault("ROCKROLL_HOME", _home)
os.environ.setdefault("ROCKROLL_CGROUP_PARENT", "rockroll-test")
# The storage plane keeps 2 GiB of the disk free by default (sandbox/storage/limits.py), a reserve
# for a host that runs other things. CI's disk is shared and its free space varies from run to run;
# with the default, a run that starts near the line fails every snapshot after it. The suite keeps
# 512 MiB instead; test_storage_plane.py sets its own reserves to test the refusal itself.
os.environ.setdefault("ROCKROLL_MIN_FREE_BYTES", "512M")
# The session's home goes with the session (layer caches and snapshots reach gigabytes). Registered
# before anything of rockroll is imported, so it runs after rockroll's own exit handlers have closed
# and reaped the session's sandboxes. ROCKROLL_TEST_KEEP_HOME=1 keeps it, to look into.
if os.environ.get("ROCKROLL_TEST_KEEP_HOME") != "1":
    atexit.register(shutil.rmtree, _home, ignore_errors=True)


def _import_rockroll() -> None:
    """Import rockroll from the editable install, with the test folders off sys.path: there the
    folder tests/rockroll/ (no __init__.py) would be found first, as a namespace package
    ``rockroll`` (the editable install's finder comes after the path search), and rockroll's
    __init__ (the rock/ ids, the hub, gem-llm's rock: ids) would never run."""
    tests = Path(__file__).resolve().parent
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if not Path(p or os.curdir).resolve().is_relative_to(tests)]
    try:
        import rockroll  # noqa: F401
    finally:
        sys.path[:] = saved


_import_rockroll()


@pytest.fixture(scope="session")
def swe_hub() -> str:
    """The hub holding the default SWE task set: the user's default hub, where `make test`
    publishes it (`rockroll envs build-swe --default`; `make demo` one package, `--demo`). Built here if it is
    missing (minutes: a Debian base, three sdists, their test suites); a no-op otherwise.
    The tests read it through their own (empty) local cache."""
    rockroll = str(Path(sys.executable).parent / "rockroll")
    proc = subprocess.run([rockroll, "envs", "build-swe", "--default"], env=_USER_ENV,
                          capture_output=True, text=True)
    assert proc.returncode == 0, f"building the default SWE tasks failed:\n{proc.stderr[-3000:]}"
    url = subprocess.run([sys.executable, "-c", "from rockroll.envhub.store import default_hub_url as u; print(u())"],
                         env=_USER_ENV, capture_output=True, text=True, check=True).stdout.strip()
    return url


@pytest.fixture(scope="session")
def swe_agent_variant(swe_hub):
    """``build(package, agent)``: the default hub's variant of ``swe-<package>`` with ``agent``
    installed (`rockroll envs build-swe --package P --agent A`), built if it is missing
    (minutes: the agent's install steps download it from the package index)."""
    rockroll = str(Path(sys.executable).parent / "rockroll")

    def build(package: str, agent: str) -> None:
        proc = subprocess.run([rockroll, "envs", "build-swe", "--package", package, "--agent", agent],
                              env=_USER_ENV, capture_output=True, text=True)
        assert proc.returncode == 0, f"building {package} with {agent} failed:\n{proc.stderr[-3000:]}"
    return build


# --------------------------------------------------------------------------- no silent skips
# Under CI=true (.ci/run and `make test` set it) a skipped test is a failure: a skip there
# means a dependency or a service CI is meant to provide went missing, and a suite that
# silently tests less must not go green. The one exception: a test marked `gpu` on a
# machine without a GPU, which no CPU runner can execute.
def _strict() -> bool:
    return os.environ.get("CI") == "true"


def _no_gpu() -> bool:
    import torch  # a declared test dependency

    return not torch.cuda.is_available()


def _fail_skip(report, where: str, gpu: bool) -> None:
    if not (_strict() and report.skipped) or hasattr(report, "wasxfail"):
        return
    if gpu and _no_gpu():
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"CI=true: a skipped {where} is a failure (mark it `gpu` only if it needs a GPU): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip(outcome.get_result(), "test", item.get_closest_marker("gpu") is not None)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level skip (importorskip, allow_module_level) skips a whole file
    _fail_skip(outcome.get_result(), "module", False)
