"""Build an env package into layers: ``build("./counter")`` -> ``BuildResult``.

1. The base becomes layers: ``host`` none (the sandbox's host image is under everything),
   ``debian:<suite>`` / ``docker:<image>`` one packed rootfs layer, ``hub:<name>@<ver>``
   that env's layers (pulled; the ref is pinned to the exact version in the manifest).
2. A local sandbox on that base gets the package's files; with a network of its own
   only where the package names hosts (``network = [...]``, its allow-list: the package
   indexes and mirrors its setup steps install from, ``rockroll.sandbox.EgressPolicy``),
   then runs the setup steps; a failing step fails the build with its stderr (one whose
   output shows a failed name lookup or connection with ``BuildNetworkError``, whose last
   sentence names the fix: ``netcause.py``). Where the host names its own CA bundle (``$PIP_CERT``, ``$SSL_CERT_FILE``,
   ``$REQUESTS_CA_BUNDLE``: a network behind a TLS-inspecting proxy), the steps get it too
   (the same variables, pointing at a copy removed before the layer is packed), so a
   ``pip install`` step reaches the package index the way the host's pip does. The upper layer is packed reproducibly (sorted entries, zero mtimes and owners):
   the same inputs give the same digest, so re-building and re-publishing is a no-op.
3. Each named snapshot: back to the post-setup state, run its commands, ``snapshot()``;
   packed the same way (sessions kept, minus the per-sandbox HOSTNAME).
4. The ``private`` folder, if any, is packed on its own (reproducibly): a blob the host
   side of the env reads, never a layer of a sandbox.

The manifest is kept in ``<home>/hub-builds/<name>/<version>.json`` with the digest of
the inputs, so ``hub publish DIR`` reuses an up-to-date build instead of running setup again.
"""

from __future__ import annotations

import os
import posixpath
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path

from rockroll.sandbox import EgressPolicy, SandboxError, SandboxSpec, SandboxStartError, Snapshot, open_sandbox
from rockroll.sandbox.storage.layers import pack_layer, read_meta

from . import indexes
from .bases import debian_base_layer, docker_base_layer
from .cache import LocalCache, write_atomic
from .errors import BuildError, BuildNetworkError, HubError
from .manifest import EnvManifest, LayerRef
from .netcause import BUILD_NETWORK_VAR, start_hint, step_hint
from .package import Package, entry_kwargs, load_package
from .pull import pull

# setup steps compile, install, unpack: more room than an episode's sandbox (16 GiB of disk, sparse)
BUILD_SPEC = dict(memory_mb=4096, pids=2048, cpus=None, disk_mb=16384)
CA_VARS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")  # the host's trust, if it names one
_BUILD_CA = "/tmp/.rockroll-build-ca.pem"
_HOSTNAME = re.compile(r"^(declare -x|export) HOSTNAME=.*$\n?", re.M)


@dataclass(frozen=True)
class BuildResult:
    manifest: EnvManifest
    record: Path  # the local build record (manifest JSON)
    reused: bool  # an up-to-date earlier build was returned
    seconds: float


def build(folder: str | Path, *, cache: LocalCache | None = None, hub: str | None = None,
          rebuild: bool = False, log=None) -> BuildResult:
    """Build the package in ``folder``. ``hub`` is where a ``hub:`` base is pulled from."""
    t0 = time.perf_counter()
    pkg = load_package(folder)
    cache = cache or LocalCache()
    record = cache.build_file(pkg.name, pkg.version)
    source = pkg.source_digest()
    if not rebuild and record.is_file():
        try:
            old = EnvManifest.from_json(record.read_bytes(), str(record))
            if old.source_digest == source and all(cache.layers.tarball(l.digest).is_file() for l in old.blobs()):
                return BuildResult(old, record, True, time.perf_counter() - t0)
        except HubError:
            pass  # unreadable record: build again
    say = log or (lambda msg: None)
    if pkg.entry_point:  # an image only has none
        warning = check_entry_point(pkg)
        if warning:
            say(warning)
    base, system, base_layers, image = _base(pkg, cache, hub)
    throwaway: list[Snapshot] = []
    env_layer: LayerRef | None = None
    snapshots: dict[str, tuple[LayerRef, ...]] = {}
    spec = None

    def hint(cmd: str, r) -> str | None:  # a step that failed for the network says so, and the fix
        return None if r.ok else step_hint(cmd, f"{r.stdout}\n{r.stderr}", listed=pkg.network,
                                           network=spec.network, allowed=spec.egress.hosts if spec.egress else ())

    try:
        spec = SandboxSpec(image=image, **setup_network(pkg.network), timeout_s=pkg.setup_timeout_s, **BUILD_SPEC)
        with open_sandbox(spec) as sb:
            for host, dest in pkg.copies():
                say(f"copy {host} -> {dest}")
                parent = dest if host.is_dir() else posixpath.dirname(dest)
                _check(sb.run(f"mkdir -p {shlex.quote(parent)}"), f"mkdir {parent}")
                sb.upload(host, dest)
            step_env = _forward_ca(sb) if pkg.setup else {}
            for i, step in enumerate(pkg.setup, 1):
                say(f"setup [{i}/{len(pkg.setup)}] {step}")
                r = sb.run(step, timeout=pkg.setup_timeout_s, env=step_env)
                _check(r, f"setup step {i} ({step!r})", hint(step, r))
            if step_env:
                _check(sb.run(f"rm -f {_BUILD_CA}"), "removing the host's CA bundle")
            after_setup = sb.snapshot()
            throwaway.append(after_setup)
            env_layer = _repack(cache, after_setup, None)
            for snap in pkg.snapshots:
                say(f"snapshot {snap.name}")
                sb.restore(after_setup)
                for i, cmd in enumerate(snap.commands, 1):
                    r = sb.run(cmd, timeout=pkg.setup_timeout_s)
                    _check(r, f"snapshot {snap.name!r} command {i} ({cmd!r})", hint(cmd, r))
                taken = sb.snapshot()
                throwaway.append(taken)
                meta = read_meta(taken.path)
                meta = {"format": 1, "image": f"hub:{pkg.name}@{pkg.version}", "parents": [],
                        "workdir": meta.get("workdir", "/workspace"),
                        "sessions": {k: _HOSTNAME.sub("", v) for k, v in meta.get("sessions", {}).items()}}
                snapshots[snap.name] = (_repack(cache, taken, meta),)
    except SandboxError as e:
        # the network the package lists could not be made here (sandbox/deployment/network.py's
        # "sandbox network: ..." refusals): the way out is the operator's variable
        if spec and spec.network is True and isinstance(e, SandboxStartError) and "sandbox network" in str(e):
            raise BuildNetworkError(f"building {pkg.name}@{pkg.version}: {e}\n{start_hint(pkg.network)}") from e
        raise BuildError(f"building {pkg.name}@{pkg.version}: {e}") from e
    finally:
        keep = {l.digest for layers in snapshots.values() for l in layers}
        keep |= {env_layer.digest} if env_layer else set()
        for snap in throwaway:  # the non-reproducible originals; their repacked twins stay
            if snap.digest not in keep:
                cache.layers.tarball(snap.digest).unlink(missing_ok=True)
                cache.layers.drop_layer(snap.digest)
    private = None
    if pkg.private:
        info = pack_layer(pkg.root / pkg.private, cache.layers.tar_root, reproducible=True)
        cache.mark_owned(info.digest)
        private = LayerRef(info.digest, info.size)
    manifest = EnvManifest(
        name=pkg.name, version=pkg.version, description=pkg.description, license=pkg.license,
        base=base, system=system, layers=(*base_layers, env_layer), entry_point=pkg.entry_point,
        kwargs=pkg.kwargs, gym_id=pkg.gym_id, tasks=pkg.tasks_dest, python=pkg.python_dest,
        snapshots=snapshots, source_digest=source, private=private)
    write_atomic(record, manifest.to_json())
    return BuildResult(manifest, record, False, time.perf_counter() - t0)


def setup_network(names: tuple[str, ...]) -> dict:
    """The spec fields of a build's setup sandbox for a package's ``network`` list: none
    without one; else a network of its own allowing those hosts (roles expanded,
    ``indexes.py``). ``$ROCKROLL_BUILD_NETWORK=host`` is the operator's way out on a
    machine where nothing may be wired into its own namespace (this project's CI): setup
    steps then share the building process's network, as Docker's ``--network host``, and
    the allow-list is not applied: only for packages the operator trusts."""
    mode = os.environ.get(BUILD_NETWORK_VAR, "policy")
    if mode not in ("policy", "host"):
        raise BuildError(f"${BUILD_NETWORK_VAR} must be 'policy' or 'host', not {mode!r}")
    if not names:
        return {"network": False}
    if mode == "host":
        return {"network": "host"}
    return {"network": True, "egress": EgressPolicy(hosts=indexes.expand(names))}


def _forward_ca(sb) -> dict[str, str]:
    """Copy the CA bundle the host names into the build sandbox; the setup steps' env."""
    host = next((os.environ[v] for v in CA_VARS if os.path.isfile(os.environ.get(v) or "")), None)
    if host is None:
        return {}
    sb.write_file(_BUILD_CA, Path(host).read_bytes())
    return dict.fromkeys(CA_VARS, _BUILD_CA)


_ENTRY_CHECK = """
import importlib, json, sys
entry, python, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if python:
    sys.path.insert(0, python)
module, _, attr = entry.partition(":")
cls = getattr(importlib.import_module(module), attr)
try:
    env = cls(**args)
except TypeError as e:  # the call itself: a keyword the class (or its bases) does not take
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(3)
except Exception as e:  # the constructor's own work (a hub, a service) may need what only make time has
    print(f"{type(e).__name__}: {e}", file=sys.stderr)
    sys.exit(4)
getattr(env, "close", lambda: None)()
"""


def check_entry_point(pkg: Package) -> str | None:
    """The entry point must import and construct as ``gymnasium.make`` will: imported from the
    package's ``python`` folder (put on ``sys.path`` then) or from what is installed, never
    from the folder the build happens to run in, and called once with the keyword arguments
    make passes (``entry_kwargs``: the manifest's kwargs, ``image``, ``tasks_file``,
    ``private_dir``), then closed. Checked before the build, in a fresh interpreter run from
    an empty folder, so a missing ``python`` key or a class that does not take ``image=``
    (a ``TypeError`` of the call) fails here, not at make time. Any other error of the
    constructor is returned as a warning: its work may need what only make time has (the
    image published, a hub's tasks)."""
    import json
    import subprocess
    import sys
    import tempfile

    python = str(pkg.root / pkg.python) if pkg.python else ""
    args = entry_kwargs(pkg.kwargs, f"hub:{pkg.name}@{pkg.version}",
                        str(pkg.root / pkg.tasks) if pkg.tasks else None,
                        str(pkg.root / pkg.private) if pkg.private else None)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with tempfile.TemporaryDirectory() as empty:
        r = subprocess.run([sys.executable, "-P", "-c", _ENTRY_CHECK, pkg.entry_point, python, json.dumps(args)],
                           capture_output=True, text=True, cwd=empty, env=env, timeout=300)
    why = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
    if r.returncode == 3:
        call = ", ".join(f"{k}={v!r}" for k, v in args.items())
        raise BuildError(f"{pkg.name}@{pkg.version}: gymnasium.make will construct {pkg.entry_point}({call}), "
                         f"and that failed: {why}. An env class must accept its [env] kwargs and image= (the "
                         "package's sandbox image), and tasks_file= / private_dir= when the package has tasks / "
                         "private files (docs/env-contract.md)")
    if r.returncode == 4:
        return (f"warning: constructing {pkg.entry_point} as gymnasium.make will failed here ({why}); "
                "if it needs only what make time brings (the published image, a hub), this is expected")
    if r.returncode:
        module = pkg.entry_point.partition(":")[0]
        where = (f"the package's python folder {pkg.python!r} or the installed packages" if pkg.python else
                 f'the installed packages; to ship it, set python = "<folder holding {module.replace(".", "/")}.py>" '
                 "in rockenv.toml")
        raise BuildError(f"{pkg.name}@{pkg.version}: entry_point {pkg.entry_point!r} does not import from {where}: "
                         f"{why}")
    return None


def _base(pkg: Package, cache: LocalCache, hub: str | None) -> tuple[str, str, tuple[LayerRef, ...], str]:
    """(base as recorded, system, base layers, image the build sandbox runs on)."""
    kind, _, arg = pkg.base.partition(":")
    if pkg.base == "host":
        return "host", "host", (), "host"
    if kind == "debian":
        return pkg.base, "rootfs", (debian_base_layer(arg, cache),), pkg.base
    if kind == "docker":
        return pkg.base, "rootfs", (docker_base_layer(arg, cache),), pkg.base
    parent = pull(arg, hub=hub, cache=cache)
    return f"hub:{parent.manifest.ref}", parent.manifest.system, parent.manifest.layers, parent.image


def _repack(cache: LocalCache, snap: Snapshot, meta: dict | None) -> LayerRef:
    """Pack a snapshot's files again, reproducibly: ``snapshot()`` keeps mtimes and owners
    (right for a live sandbox, wrong for a build that must give the same digest twice)."""
    info = pack_layer(cache.layers.layer_dir(snap.digest), cache.layers.tar_root, meta=meta, reproducible=True)
    cache.mark_owned(info.digest)
    return LayerRef(info.digest, info.size)


def _check(result, what: str, hint: str | None = None) -> None:
    """A failed command fails the build with its output's tail, then ``hint`` (the fix, when
    the output shows the network failed) last: below 30 lines of pip's retries, not above them."""
    if not result.ok:
        why = "timed out" if result.timed_out else f"exit {result.exit_code}"
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-30:])
        if hint:
            raise BuildNetworkError(f"{what} failed ({why}):\n{tail}\n{hint}")
        raise BuildError(f"{what} failed ({why}):\n{tail}")
