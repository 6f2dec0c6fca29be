"""Gymnasium ids for the envs of a hub: ``rock/<name>-v<major>`` (or the manifest's
``gym_id``), each bound to the latest non-yanked release of that major.

Registration only lists (names and versions) and reads one small manifest per id;
``gymnasium.make`` pulls lazily: the entry point is ``make_hub_env``, which pulls the env,
imports its entry point class (from the env's shipped python folder if the host lacks
it) and calls it with the manifest's kwargs, ``image="hub:<name>@<version>"`` and
``tasks_file`` (the host path of the env's tasks file) and ``private_dir`` (the host path
of its host-only files) if it has them.

A package without an ``[env]`` table is an image only (a base for sandboxes and other
packages, e.g. ``swe-python``): its id is registered so that ``gymnasium.make`` says so
(:func:`make_base_image`, naming the envs built on it), and it is not listed as an env.

Entry points are code from the hub, run in your process: register only hubs you trust,
as you would a package index.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import gymnasium

__all__ = ["HubEnvInfo", "is_base_image", "list_envs", "make_base_image", "make_hub_env", "register_default_hub",
           "register_hub"]


def make_hub_env(*, hub_url: str, hub_env: str, hub_version: str, **kwargs):
    """Gymnasium entry point of a hub env: pull, import, construct."""
    from rockroll.envhub.package import entry_kwargs
    from rockroll.envhub.pull import pull

    env = pull(f"{hub_env}@{hub_version}", hub=hub_url)
    cls = _import_entry_point(env.manifest.entry_point, env.python_path)
    args = entry_kwargs({**env.manifest.kwargs, **kwargs}, env.image,
                        None if env.tasks_file is None else str(env.tasks_file),
                        None if env.private_dir is None else str(env.private_dir))
    try:
        return cls(**args)
    except TypeError as e:
        if "unexpected keyword argument" not in str(e):
            raise
        raise TypeError(f"{e}: gymnasium.make called {env.manifest.entry_point}({', '.join(args)}); an env class "
                        "must accept its [env] kwargs and image= (and tasks_file= / private_dir= when the package "
                        "has them): docs/env-contract.md") from e


def make_base_image(*, hub_url: str, hub_env: str, hub_version: str, **kwargs):
    """Gymnasium entry point of an image-only package: refuse, saying what it is for."""
    from rockroll.envhub.cache import LocalCache
    from rockroll.envhub.errors import EnvNotFound

    cache, image = LocalCache(), f"hub:{hub_env}@{hub_version}"
    users = []
    for env_id, spec in sorted(gymnasium.registry.items()):
        kw = spec.kwargs or {}
        if spec.entry_point is make_hub_env and kw.get("hub_url") == hub_url:
            manifest = cache.load_manifest(hub_url, kw["hub_env"], kw["hub_version"])
            if manifest is not None and manifest.base.startswith(f"hub:{hub_env}@"):
                users.append(env_id)
    raise EnvNotFound(f"{image} is a base image, not an env: nothing to make. Run sandboxes on it "
                      f"(SandboxSpec(image={image!r})) or build on it (base = {image!r} in rockenv.toml); "
                      f"envs built on it: {', '.join(users) or 'none on ' + hub_url}")


def is_base_image(env_id: str) -> bool:
    """Whether a registered id is an image-only hub package (not an env)."""
    spec = gymnasium.registry.get(env_id)
    return spec is not None and spec.entry_point is make_base_image


def _import_entry_point(entry_point: str, python_path) -> type:
    module_name, _, attr = entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if python_path is None or (e.name and module_name.split(".")[0] != e.name.split(".")[0]):
            raise
        # The env ships its own host-side code; first import of a module name wins for the
        # process (as with any sys.path entry).
        if str(python_path) not in sys.path:
            sys.path.append(str(python_path))
        module = importlib.import_module(module_name)
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def register_hub(url: str | None = None, *, offline: bool = False, endpoint: str | None = None) -> list[str]:
    """Register every env of the hub at ``url`` (default hub if None); return the ids.

    ``offline=True`` uses only what the local cache knows (no network): what
    ``import rockroll`` does for hubs that are not a local folder.
    """
    from rockroll.envhub.cache import LocalCache
    from rockroll.envhub.errors import HubError, StoreUnavailable
    from rockroll.envhub.manifest import EnvManifest
    from rockroll.envhub.store import HubStore, default_hub_url, local_listing, normalize_url
    from rockroll.envhub.version import latest_per_major

    url = normalize_url(url or default_hub_url())
    cache = LocalCache()
    store = None
    folder = Path(url[len("file://"):]) if url.startswith("file://") else None
    if offline:
        listing = cache.load_listing(url)
    elif folder is not None:  # plain os calls: this runs at `import rockroll`
        listing = local_listing(folder / "envs")
    else:
        store = HubStore(url, endpoint=endpoint)
        try:
            listing = store.listing()
            cache.save_listing(url, listing)
        except StoreUnavailable:
            listing = cache.load_listing(url)
    ids = []
    for name, versions in sorted(listing.items()):
        for major, version in latest_per_major(versions).items():
            gym_id = f"rock/{name}-v{major}"
            manifest = cache.load_manifest(url, name, version)
            if manifest is None and folder is not None:
                path = folder / "envs" / name / f"{version}.json"
                try:
                    manifest = EnvManifest.from_json(path.read_bytes(), str(path))
                    cache.save_manifest(url, manifest)
                except (OSError, HubError):
                    manifest = None
            elif manifest is None and store is not None:
                try:
                    from rockroll.envhub.pull import resolve

                    manifest, _ = resolve(f"{name}@{version}", store, cache)
                except HubError:
                    manifest = None
            if manifest is not None and manifest.gym_id:
                gym_id = manifest.gym_id
            existing = gymnasium.registry.get(gym_id)
            if existing is not None:
                if existing.entry_point not in (make_hub_env, make_base_image):
                    continue  # never shadow a built-in (or anyone else's) id
                del gymnasium.registry[gym_id]
            image_only = manifest is not None and not manifest.entry_point
            gymnasium.register(id=gym_id, entry_point=make_base_image if image_only else make_hub_env,
                               kwargs={"hub_url": url, "hub_env": name, "hub_version": version})
            if not image_only:
                ids.append(gym_id)
    return ids


def register_default_hub() -> list[str]:
    """What ``import rockroll`` calls: cheap and never raising. A local-folder hub is listed
    (a few directory reads); any other hub is registered from the local cache only."""
    try:
        from rockroll.envhub.store import default_hub_url, normalize_url

        url = normalize_url(default_hub_url())
        return register_hub(url, offline=not url.startswith("file://"))
    except Exception as e:  # import must never fail because of a hub
        warnings.warn(f"rockroll: hub envs not registered: {e}", RuntimeWarning, stacklevel=2)
        return []


@dataclass(frozen=True)
class HubEnvInfo:
    id: str
    source: str  # "builtin" or the hub URL
    version: str
    description: str


def list_envs() -> list[HubEnvInfo]:
    """Every ``rock/`` env registered in gymnasium, with where it comes from (base images,
    which are no envs, left out)."""
    from rockroll.envhub.cache import LocalCache

    cache = LocalCache()
    out = []
    for env_id, spec in sorted(gymnasium.registry.items()):
        if not env_id.startswith("rock/") or spec.entry_point is make_base_image:
            continue
        if spec.entry_point is make_hub_env:
            kw = spec.kwargs
            manifest = cache.load_manifest(kw["hub_url"], kw["hub_env"], kw["hub_version"])
            out.append(HubEnvInfo(env_id, kw["hub_url"], kw["hub_version"],
                                  manifest.description if manifest else ""))
        else:
            out.append(HubEnvInfo(env_id, "builtin", "-", _doc_line(spec.entry_point)))
    return out


def _doc_line(entry_point) -> str:
    try:
        if callable(entry_point):
            obj = entry_point
        else:
            module, _, attr = str(entry_point).partition(":")
            obj = getattr(importlib.import_module(module), attr)
        line = obj.__doc__.strip().splitlines()[0] if obj.__doc__ else ""
        # name the module, so the pointer can be followed: help(rockroll.gem.swe)
        return line.replace("see the module docstring", f"see help({obj.__module__})")
    except Exception:
        return ""
