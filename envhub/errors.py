"""Typed errors of the env hub, in one hierarchy: catch ``HubError`` for everything.

Each error says *what* is wrong and *where* (the file and key of a manifest, the digest of
a blob, the URL of a hub), because the person reading it is usually fixing a package or a
bucket, not reading our code.
"""

from __future__ import annotations


class HubError(Exception):
    """Base class of every env hub failure."""


class ManifestError(HubError, ValueError):
    """A ``rockenv.toml`` (or a published manifest) is invalid: ``file`` and ``key`` say where."""

    def __init__(self, file: str, key: str, message: str):
        super().__init__(f"{file}: {key}: {message}")
        self.file, self.key, self.message = str(file), key, message


class BuildError(HubError):
    """Building an env package failed (a setup step, a base image, copying files)."""


class BuildNetworkError(BuildError):
    """A build failed for the network: a setup step found none (the package lists no
    hosts), or not the host it reached for (not on the allow-list), or the build's sandbox
    could not get the network the package lists. The message ends with the fix."""


class EnvNotFound(HubError, LookupError):
    """No env (or no version matching a ref) in the hub."""


class VersionConflict(HubError):
    """A version is already published with different content; versions are immutable."""


class BlobMissing(HubError):
    """A manifest names a blob the hub does not have; ``digest`` names it."""

    def __init__(self, digest: str, where: str):
        super().__init__(f"blob {digest} is missing from {where}")
        self.digest = digest


class BlobCorrupted(HubError):
    """A blob's bytes do not match its digest (corrupted or truncated); the bad local copy
    was deleted, so a retry downloads it again."""

    def __init__(self, digest: str, message: str):
        super().__init__(f"blob {digest}: {message}")
        self.digest = digest


class StoreUnavailable(HubError):
    """The hub's storage cannot be reached (network, credentials, server down)."""


class YankedWarning(UserWarning):
    """A pinned version was yanked: it still pulls, but its publisher withdrew it."""
