"""Semantic versions and env refs: ``name``, ``name@1.2.3``, ``name@1``, ``name@latest``.

A tiny semver parser instead of ``packaging.version``: PEP 440 reads ``1.0.0-foo`` as an
error and ``1.0.0-rc.1`` as ``1.0.0rc1``, while env authors write semver. Build metadata
(``+build``) is refused: semver gives it no order, so two such versions would collide.

Resolution (``select``):

- ``latest`` (or nothing): the highest version that is neither yanked nor a pre-release;
- ``1`` / ``1.2``: the highest such version with that major (and minor);
- ``1.2.3`` / ``1.2.3-rc.1``: exactly that version, even yanked (with a warning, so those
  who pinned it keep working) or a pre-release (pinning is how you opt into one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import total_ordering
from typing import Iterable, Mapping

from .errors import EnvNotFound

# re.ASCII: without it \d also matches other scripts' digits, which int() reads too, so
# "1\u0661.0.0" would parse as 11.0.0 and two files would name one version.
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*)(?:\.(?:0|[1-9]\d*|\d*[A-Za-z-][0-9A-Za-z-]*))*))?",
    re.ASCII)
_PARTIAL = re.compile(r"(0|[1-9]\d*)(?:\.(0|[1-9]\d*))?", re.ASCII)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    pre: tuple[int | str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Version":
        m = _SEMVER.fullmatch(text) if isinstance(text, str) else None
        if m is None:
            hint = " (build metadata '+...' is not allowed)" if isinstance(text, str) and "+" in text else ""
            raise ValueError(f"{text!r} is not a semantic version MAJOR.MINOR.PATCH[-PRERELEASE]{hint}")
        pre = tuple(int(p) if p.isdigit() else p for p in m.group(4).split(".")) if m.group(4) else ()
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3)), pre)

    @property
    def prerelease(self) -> bool:
        return bool(self.pre)

    def _key(self):
        # Semver precedence: a release sorts after its pre-releases; numeric identifiers
        # sort before alphanumeric ones and compare as numbers.
        pre = tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, not self.pre, pre)

    def __lt__(self, other: "Version") -> bool:
        return self._key() < other._key()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(map(str, self.pre)) if self.pre else "")


@dataclass(frozen=True)
class EnvRef:
    """A parsed ``name[@spec][#snapshot]``; ``spec`` is ``latest``, ``1``, ``1.2`` or exact."""

    name: str
    spec: str = "latest"
    snapshot: str | None = None

    @classmethod
    def parse(cls, text: str) -> "EnvRef":
        body, _, snap = text.partition("#")
        name, _, spec = body.partition("@")
        if not NAME.fullmatch(name):
            raise EnvNotFound(f"bad env name {name!r} in {text!r} (letters, digits, '.', '_', '-')")
        spec = spec or "latest"
        if spec != "latest" and not (_PARTIAL.fullmatch(spec) or _SEMVER.fullmatch(spec)):
            raise EnvNotFound(f"bad version {spec!r} in {text!r}: use 1.2.3, 1.2, 1 or latest")
        if "#" in text and not snap:
            raise EnvNotFound(f"empty snapshot name in {text!r}")
        return cls(name, spec, snap or None)

    @property
    def exact(self) -> bool:
        return bool(_SEMVER.fullmatch(self.spec))

    def __str__(self) -> str:
        return f"{self.name}@{self.spec}" + (f"#{self.snapshot}" if self.snapshot else "")


def select(versions: Mapping[str, bool], spec: str, name: str = "env") -> tuple[str, bool]:
    """Pick the version ``spec`` means among ``versions`` ({version: yanked}); return
    ``(version, yanked)``. Raises ``EnvNotFound`` with what *is* available."""
    parsed = {}
    for text in versions:
        try:
            parsed[text] = Version.parse(text)
        except ValueError:
            continue  # a foreign file in the hub folder; not ours to resolve
    if _SEMVER.fullmatch(spec):
        want = Version.parse(spec)
        for text, v in parsed.items():
            if v == want:
                return text, versions[text]
        raise EnvNotFound(f"{name}@{spec} is not published (available: {_available(parsed, versions)})")
    if spec == "latest":
        prefix: tuple[int, ...] = ()
    else:
        m = _PARTIAL.fullmatch(spec)
        prefix = tuple(int(g) for g in m.groups() if g is not None)
    candidates = [(v, t) for t, v in parsed.items()
                  if not versions[t] and not v.prerelease and (v.major, v.minor)[:len(prefix)] == prefix]
    if not candidates:
        raise EnvNotFound(f"no release of {name} matches {spec!r} (yanked and pre-release versions "
                          f"need an exact pin; available: {_available(parsed, versions)})")
    return max(candidates)[1], False


def latest_per_major(versions: Mapping[str, bool]) -> dict[int, str]:
    """{major: latest non-yanked release of that major}: one gymnasium id per major."""
    out: dict[int, Version] = {}
    for text, yanked in versions.items():
        try:
            v = Version.parse(text)
        except ValueError:
            continue
        if yanked or v.prerelease:
            continue
        if v.major not in out or out[v.major] < v:
            out[v.major] = v
    return {major: str(v) for major, v in sorted(out.items())}


def _available(parsed: Mapping[str, Version], versions: Mapping[str, bool]) -> str:
    items = [f"{t}{' (yanked)' if versions[t] else ''}" for t, _ in sorted(parsed.items(), key=lambda kv: kv[1])]
    return ", ".join(items) or "none"


def sort_versions(texts: Iterable[str]) -> list[str]:
    """Versions in semver order (unparseable ones dropped)."""
    good = []
    for t in texts:
        try:
            good.append((Version.parse(t), t))
        except ValueError:
            pass
    return [t for _, t in sorted(good)]
