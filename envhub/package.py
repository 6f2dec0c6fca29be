"""An env package: a folder with ``rockenv.toml``, parsed into a ``Package``.

::

    name = "counter"                      # letters, digits, . _ -
    version = "1.0.0"                     # semver
    description = "Count files"
    license = "MIT"
    base = "host"                         # host | debian:<suite> | docker:<image> | hub:<name>@<ver>
    gym_id = "rock/Counter-v1"            # default rock/<name>-v<major>
    setup = ["pip install x", "..."]      # run at build time; the result is frozen
    network = ["@pip", "example.org"]     # what setup may reach (names, *. wildcards, and "@pip" /
                                          # "@apt": the indexes this machine's pip / apt use,
                                          # envhub/indexes.py): its own network behind this
                                          # allow-list; none without it
    setup_timeout_s = 900
    tasks = "tasks.jsonl"                 # copied to /rockenv/<file name>; passed as tasks_file=
    python = "src"                        # host-side code of the entry point, shipped in the env
    private = "grading"                   # host-only files (hidden tests, reference solutions):
                                          # a blob of their own, never in a sandbox; passed as private_dir=

    [files]                               # package-relative source -> absolute path in the sandbox
    "data" = "/opt/data"

    [env]                                 # without it the package is an image only: a base for
    entry_point = "counter_env:CounterEnv"  # sandboxes and other packages, no gymnasium env
    kwargs = { max_turns = 5 }

    [snapshots.warm]                      # run after setup, saved as a named snapshot
    commands = ["echo warmed > /workspace/state"]

Every error is a ``ManifestError(file, key, message)``; unknown keys are errors too, so a
typo (``setpu``) fails loudly instead of silently building a different env.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rockroll.sandbox import EgressPolicy, SpecError

from .errors import ManifestError
from .indexes import ROLES
from .version import NAME, EnvRef, Version

MANIFEST_FILE = "rockenv.toml"
ENV_DIR = "/rockenv"  # where the package's own things (tasks, python code) live in the sandbox
_KEYS = {"name", "version", "description", "license", "base", "gym_id", "setup", "setup_timeout_s", "network",
         "tasks", "python", "private", "files", "env", "snapshots"}
_GYM_ID = re.compile(r"(?:[\w:.-]+/)?[\w:.-]+-v\d+")


@dataclass(frozen=True)
class SnapshotSpec:
    name: str
    commands: tuple[str, ...]


@dataclass(frozen=True)
class Package:
    """A validated ``rockenv.toml`` and the folder it came from."""

    root: Path
    name: str
    version: str
    description: str = ""
    license: str = ""
    base: str = "host"
    gym_id: str = ""
    setup: tuple[str, ...] = ()
    setup_timeout_s: float = 900.0
    network: tuple[str, ...] = ()  # host names setup steps may reach (an EgressPolicy's hosts)
    tasks: str | None = None  # package-relative path
    python: str | None = None  # package-relative folder
    private: str | None = None  # package-relative folder, packed apart: never enters a sandbox
    files: tuple[tuple[str, str], ...] = ()  # (package-relative source, sandbox dest)
    entry_point: str = ""  # "": an image only (no [env] table)
    kwargs: dict[str, Any] = field(default_factory=dict)
    snapshots: tuple[SnapshotSpec, ...] = ()

    @property
    def major(self) -> int:
        return Version.parse(self.version).major

    @property
    def tasks_dest(self) -> str | None:
        return f"{ENV_DIR}/{posixpath.basename(self.tasks)}" if self.tasks else None

    @property
    def python_dest(self) -> str | None:
        return f"{ENV_DIR}/python" if self.python else None

    def copies(self) -> list[tuple[Path, str]]:
        """Everything copied into the sandbox, as (host path, sandbox path)."""
        out = [(self.root / src, dest) for src, dest in self.files]
        if self.tasks:
            out.append((self.root / self.tasks, self.tasks_dest))
        if self.python:
            out.append((self.root / self.python, self.python_dest))
        return out

    def source_digest(self) -> str:
        """sha256 over the manifest and every copied file (names, modes, bytes): the build's
        inputs, so an unchanged package can reuse its last build."""
        h = hashlib.sha256((self.root / MANIFEST_FILE).read_bytes())
        private = [(self.root / self.private, "(private)")] if self.private else []
        for host, dest in [*self.copies(), *private]:
            paths = [host] if host.is_file() else sorted(p for p in host.rglob("*"))
            for p in paths:
                rel = p.relative_to(host).as_posix() if p != host else ""
                st = p.lstat()
                h.update(f"\0{dest}\0{rel}\0{st.st_mode:o}\0".encode())
                if p.is_symlink():
                    h.update(os.readlink(p).encode())
                elif p.is_file():
                    with open(p, "rb") as f:
                        h.update(hashlib.file_digest(f, "sha256").digest())
        return "sha256:" + h.hexdigest()


def load_package(folder: str | os.PathLike) -> Package:
    """Parse and validate ``<folder>/rockenv.toml``."""
    root = Path(folder).resolve()
    file = root / MANIFEST_FILE
    if not file.is_file():
        raise ManifestError(str(file), "(file)", "no rockenv.toml in this folder")
    try:
        data = tomllib.loads(file.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(str(file), "(syntax)", str(e)) from None
    return parse_package(data, root, str(file))


def parse_package(data: dict, root: Path, file: str) -> Package:
    def err(key: str, msg: str) -> ManifestError:
        return ManifestError(file, key, msg)

    for key in data:
        if key not in _KEYS:
            raise err(key, f"unknown key (known: {', '.join(sorted(_KEYS))})")

    def string(key: str, default: str | None = None, *, required: bool = False) -> str | None:
        if key not in data:
            if required:
                raise err(key, "is required")
            return default
        if not isinstance(data[key], str):
            raise err(key, f"must be a string, not {type(data[key]).__name__}")
        return data[key]

    def strings(key: str, value: Any) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(s, str) and s.strip() for s in value):
            raise err(key, "must be a list of non-empty strings (shell commands)")
        return tuple(value)

    name = string("name", required=True)
    if not NAME.fullmatch(name):
        raise err("name", f"{name!r}: use letters, digits, '.', '_', '-' (at most 64, not starting with a symbol)")
    version = string("version", required=True)
    try:
        parsed = Version.parse(version)
    except ValueError as e:
        raise err("version", str(e)) from None

    base = string("base", "host")
    kind, _, arg = base.partition(":")
    if base != "host":
        if kind not in ("debian", "docker", "hub") or not arg:
            raise err("base", f"{base!r}: use host, debian:<suite>, docker:<image> or hub:<name>@<version>")
        if kind == "debian" and not re.fullmatch(r"[a-z][a-z0-9-]*", arg):
            raise err("base", f"{arg!r} is not a Debian suite name (e.g. bookworm)")
        if kind == "hub":
            try:
                ref = EnvRef.parse(arg)
            except Exception as e:
                raise err("base", str(e)) from None
            if ref.snapshot:
                raise err("base", "a base env cannot name a snapshot")

    gym_id = string("gym_id", f"rock/{name}-v{parsed.major}")
    if not _GYM_ID.fullmatch(gym_id):
        raise err("gym_id", f"{gym_id!r} is not a gymnasium id like rock/Name-v1")

    setup = strings("setup", data["setup"]) if "setup" in data else ()
    network = strings("network", data["network"]) if "network" in data else ()
    try:  # a role ("@pip") stays a role until the build reads this machine's indexes
        network = tuple(n if n in ROLES else EgressPolicy(hosts=(n,)).hosts[0] for n in network)
    except SpecError as e:
        raise err("network", str(e)) from None
    timeout = data.get("setup_timeout_s", 900.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise err("setup_timeout_s", "must be a positive number of seconds")

    def inside(key: str, rel: str, *, want_dir: bool | None = None) -> str:
        # Sources must stay inside the package: a build must not read the publisher's ~/.ssh.
        path = (root / rel).resolve()
        if os.path.isabs(rel) or not path.is_relative_to(root):
            raise err(key, f"{rel!r} must be a path inside the package folder")
        if not path.exists():
            raise err(key, f"{rel!r} does not exist in {root}")
        if want_dir is not None and path.is_dir() != want_dir:
            raise err(key, f"{rel!r} must be a {'folder' if want_dir else 'file'}")
        return path.relative_to(root).as_posix()

    tasks = inside("tasks", string("tasks"), want_dir=False) if "tasks" in data else None
    python = inside("python", string("python"), want_dir=True) if "python" in data else None
    private = inside("private", string("private"), want_dir=True) if "private" in data else None

    files = []
    raw_files = data.get("files", {})
    if not isinstance(raw_files, dict):
        raise err("files", "must be a table of \"source\" = \"/absolute/dest\"")
    for src, dest in raw_files.items():
        key = f"files.{src}"
        if not isinstance(dest, str) or not posixpath.isabs(dest) or ".." in dest.split("/"):
            raise err(key, f"destination {dest!r} must be an absolute path in the sandbox without '..'")
        if posixpath.normpath(dest) == ENV_DIR or dest.startswith(ENV_DIR + "/"):
            raise err(key, f"{ENV_DIR} is reserved for the package's tasks and python code")
        files.append((inside(key, src), posixpath.normpath(dest)))

    env = data.get("env")
    if env is not None and (not isinstance(env, dict) or "entry_point" not in env):
        raise err("env", "must be a table with entry_point = \"module:Class\" and optional kwargs "
                         "(leave [env] out for an image only: a base, no gymnasium env)")
    env = env or {}
    for key in env:
        if key not in ("entry_point", "kwargs"):
            raise err(f"env.{key}", "unknown key (known: entry_point, kwargs)")
    entry = env.get("entry_point", "")
    if env and (not isinstance(entry, str) or not re.fullmatch(r"[\w.]+:[\w.]+", entry)):
        raise err("env.entry_point", f"{entry!r}: must be \"module:Class\"")
    kwargs = env.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise err("env.kwargs", "must be a table")
    for reserved in ("image", "tasks_file", "private_dir"):
        if reserved in kwargs:
            raise err(f"env.kwargs.{reserved}", "is set by the hub at make time")

    snaps = []
    raw_snaps = data.get("snapshots", {})
    if not isinstance(raw_snaps, dict):
        raise err("snapshots", "must be a table of [snapshots.<name>] tables")
    for snap_name, spec in raw_snaps.items():
        key = f"snapshots.{snap_name}"
        if not NAME.fullmatch(snap_name):
            raise err(key, "snapshot names use letters, digits, '.', '_', '-'")
        if not isinstance(spec, dict) or set(spec) - {"commands"}:
            raise err(key, "must be a table with only commands = [...]")
        snaps.append(SnapshotSpec(snap_name, strings(f"{key}.commands", spec.get("commands"))))

    return Package(root=root, name=name, version=version, description=string("description", ""),
                   license=string("license", ""), base=base, gym_id=gym_id, setup=setup,
                   setup_timeout_s=float(timeout), network=network, tasks=tasks, python=python, private=private, files=tuple(files),
                   entry_point=entry, kwargs=dict(kwargs), snapshots=tuple(snaps))


def entry_kwargs(kwargs: dict[str, Any], image: str, tasks_file: str | None = None,
                 private_dir: str | None = None) -> dict[str, Any]:
    """The keyword arguments ``gymnasium.make`` gives an env package's class: the manifest's
    (and the caller's) ``kwargs``, ``image`` (the package's own sandbox image), and
    ``tasks_file`` / ``private_dir`` where the package has them. The one definition that
    ``hub build``'s check and ``make_hub_env`` both use."""
    args = {**kwargs, "image": image}
    if tasks_file is not None:
        args.setdefault("tasks_file", tasks_file)
    if private_dir is not None:
        args.setdefault("private_dir", private_dir)
    return args
