"""rockroll.envhub: versioned, pre-warmed sandbox images published to object storage.

    from rockroll.envhub import build, publish, pull, HubStore
    result = build("./counter")                          # layers + manifest, reproducible
    publish(result.manifest, HubStore("s3://bucket/hub"))
    env = pull("counter@1", hub="s3://bucket/hub")        # verified, unpacked, cached
    SandboxSpec(image="hub:counter@1.0.0")                # mounts the pulled layers

Modules: ``package`` (rockenv.toml), ``manifest`` (published JSON), ``version`` (semver,
refs), ``store`` (fsspec storage layout), ``cache`` (local state, gc), ``build``,
``publish``, ``pull``, ``bases`` (debian/docker base layers), ``hooks`` (sandbox schemes).
"""

from .cache import LocalCache, gc
from .errors import (BlobCorrupted, BlobMissing, BuildError, BuildNetworkError, EnvNotFound, HubError,
                     ManifestError, StoreUnavailable, VersionConflict, YankedWarning)
from .manifest import EnvManifest, LayerRef
from .package import Package, load_package
from .store import HubStore, default_hub_url
from .version import EnvRef, Version, select

# After the submodules: these functions shadow the module names on the package object
# (`rockroll.envhub.pull` is the function; `import rockroll.envhub.pull as m` still gives the module).
from .build import BuildResult, build  # noqa: E402
from .publish import PublishResult, publish, yank  # noqa: E402
from .pull import PulledEnv, pull, resolve  # noqa: E402



__all__ = ["BlobCorrupted", "BlobMissing", "BuildError", "BuildNetworkError", "BuildResult", "EnvManifest",
           "EnvNotFound", "EnvRef", "HubError", "HubStore", "LayerRef", "LocalCache", "ManifestError", "Package",
           "PublishResult", "PulledEnv", "StoreUnavailable", "Version", "VersionConflict", "YankedWarning",
           "build", "default_hub_url", "gc", "load_package", "publish", "pull", "resolve", "select", "yank"]
