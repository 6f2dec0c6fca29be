"""Running the local backend as an unprivileged user in tests: a copy of the package, run
as uid 65534 (nobody) with the system Python, because the project's interpreter and
checkout may sit in folders nobody cannot read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zstandard

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PY = "/usr/bin/python3"


def system_python_matches() -> bool:
    if not os.path.exists(SYSTEM_PY):
        return False
    out = subprocess.run([SYSTEM_PY, "-c", "import sys; print(sys.version_info[:2])"],
                         capture_output=True, text=True)
    return out.stdout.strip() == str(tuple(sys.version_info[:2]))


def nobody_package(folder: Path, *extra: Path) -> Path:
    """``folder``/pkg: ``rockroll.sandbox``, zstandard and ``extra`` files, readable by all;
    ``folder``/home, writable by all. Returns the package folder (PYTHONPATH)."""
    pkg = folder / "pkg"
    (pkg / "rockroll").mkdir(parents=True)
    (pkg / "rockroll" / "__init__.py").write_text("")
    shutil.copytree(ROOT / "sandbox", pkg / "rockroll" / "sandbox", ignore=shutil.ignore_patterns("__pycache__"))
    zdir = Path(zstandard.__file__).parent
    shutil.copytree(zdir, pkg / zdir.name)
    for f in extra:
        shutil.copy(f, pkg / f.name)
    home = folder / "home"
    home.mkdir()
    for p in (folder, pkg, home):
        os.chmod(p, 0o777)
    subprocess.run(["chmod", "-R", "a+rX", str(pkg)], check=True)
    return pkg


def nobody_env(folder: Path, **more: str) -> dict[str, str]:
    home = folder / "home"
    return {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(home), "PYTHONPATH": str(folder / "pkg"),
            "ROCKROLL_HOME": str(home / "state"), **more}


AS_NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def world_tmp():
    """A temp dir nobody can reach (pytest's tmp_path sits under a 0700 folder)."""
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="rockroll-unpriv-", dir="/tmp"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
