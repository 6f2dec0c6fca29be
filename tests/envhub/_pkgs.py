"""The envhub tests' package factory (a module, not conftest: another folder's conftest
can shadow the name ``conftest`` when the whole suite runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

PKG = Path(__file__).parent / "pkgs" / "counter"


def make_pkg(dest: Path, *, version: str = "1.0.0", data: str | None = None, snapshots: bool = True,
             name: str = "counter", extra: str = "") -> Path:
    """A copy of the counter package with another version/data/name."""
    shutil.copytree(PKG, dest)
    toml = (dest / "rockenv.toml").read_text()
    toml = toml.replace('version = "1.0.0"', f'version = "{version}"').replace('name = "counter"', f'name = "{name}"')
    if not snapshots:
        toml = toml[: toml.index("[snapshots.warm]")]
    (dest / "rockenv.toml").write_text(toml + extra)
    if data is not None:
        (dest / "data" / "data.txt").write_text(data)
    return dest
