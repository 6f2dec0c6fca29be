"""The published manifest: ``envs/<name>/<version>.json``, immutable once written.

It names every layer by digest, so a manifest *is* the env: two hubs holding the same
manifest bytes and blobs serve the same filesystem. The JSON is canonical (sorted keys,
no timestamps), so building the same inputs twice gives byte-identical manifests and a
re-publish can be recognised as a no-op.

``system`` says what the layers sit on: ``"host"`` (the sandbox's host image: read-only
host /usr and friends under the layers) or ``"rootfs"`` (the layers are a whole root
filesystem: a debian or docker base layer at the bottom).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import ManifestError

SCHEMA = "rockroll.envhub/v1"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class LayerRef:
    digest: str
    size: int


@dataclass(frozen=True)
class EnvManifest:
    name: str
    version: str
    description: str
    license: str
    base: str  # as resolved at build time: host, debian:<suite>, docker:<image>, hub:<name>@<exact>
    system: str  # "host" | "rootfs"
    layers: tuple[LayerRef, ...]  # base first; the host image (system="host") is not a layer
    entry_point: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    gym_id: str = ""
    tasks: str | None = None  # sandbox path of the tasks file
    python: str | None = None  # sandbox path of the entry point's code
    snapshots: dict[str, tuple[LayerRef, ...]] = field(default_factory=dict)  # name -> layers above the env
    source_digest: str = ""
    # Host-only files of the env's code (hidden tests, reference solutions), packed like a
    # layer but never mounted into a sandbox: what an agent must not be able to read.
    private: LayerRef | None = None

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def blobs(self) -> list[LayerRef]:
        """Every blob the manifest needs, each once, env layers first."""
        seen, out = set(), []
        private = [self.private] if self.private else []
        for layer in [*self.layers, *(l for snap in self.snapshots.values() for l in snap), *private]:
            if layer.digest not in seen:
                seen.add(layer.digest)
                out.append(layer)
        return out

    def to_json(self) -> bytes:
        data = asdict(self)
        data["schema"] = SCHEMA
        if data["private"] is None:
            del data["private"]  # manifests of envs without private files stay byte-identical
        return (json.dumps(data, sort_keys=True, indent=1) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> "EnvManifest":
        """Parse and check a manifest (a hub is not trusted: digests are validated here,
        and every blob is verified against them when pulled)."""
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:  # deep nesting: RecursionError
            raise ManifestError(where, "(json)", str(e)) from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ManifestError(where, "schema", f"not a {SCHEMA} manifest")
        data = dict(data)
        data.pop("schema")

        def layers(key: str, value: Any) -> tuple[LayerRef, ...]:
            if not isinstance(value, list):
                raise ManifestError(where, key, "must be a list of {digest, size}")
            out = []
            for item in value:
                if (not isinstance(item, dict) or not _DIGEST.fullmatch(str(item.get("digest")))
                        or type(item.get("size")) is not int or item["size"] < 0):  # bool is an int
                    raise ManifestError(where, key, f"bad layer entry {item!r}")
                out.append(LayerRef(item["digest"], item["size"]))
            return tuple(out)

        try:
            data["layers"] = layers("layers", data.get("layers"))
            snaps = data.get("snapshots") or {}
            if not isinstance(snaps, dict):
                raise ManifestError(where, "snapshots", "must be an object")
            data["snapshots"] = {k: layers(f"snapshots.{k}", v) for k, v in snaps.items()}
            if data.get("private") is not None:
                data["private"] = layers("private", [data["private"]])[0]
            if data.get("system") not in ("host", "rootfs"):
                raise ManifestError(where, "system", "must be 'host' or 'rootfs'")
            return cls(**data)
        except TypeError as e:
            raise ManifestError(where, "(fields)", str(e)) from None
