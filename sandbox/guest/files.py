"""Files into and out of the sandbox: uploads as tar, and the file operations the host
asks for (write, read, stat, tar out). Paths are the sandbox's own: this process's root
*is* the sandbox root."""

from __future__ import annotations

import errno
import io
import os
import posixpath
import stat
import tarfile


def extract_tar(payload: bytes, dest: str) -> None:
    """Unpack an uploaded tar into ``dest``. Paths stay inside the sandbox root whatever
    they say, because this process's root *is* the sandbox root; within it, names and
    hardlink targets must stay inside ``dest`` (tarfile's ``FilterError`` otherwise)."""
    os.makedirs(dest, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(payload), mode="r:") as tar:
        for member in tar:
            if member.isdev():
                continue
            if hasattr(tarfile, "tar_filter"):
                tar.extract(member, dest, numeric_owner=True, filter=_upload_filter)
            else:
                tar.extract(member, dest, numeric_owner=True)


def _upload_filter(member, dest: str):
    """tarfile's "tar" filter, which checks names but not hardlink targets: a hardlink to a
    file outside ``dest`` would let a later member of the same name write through it."""
    member = tarfile.tar_filter(member, dest)
    if member.islnk():
        root = os.path.realpath(dest)
        target = os.path.realpath(os.path.join(root, member.linkname))
        if os.path.commonpath([root, target]) != root:
            raise tarfile.LinkOutsideDestinationError(member, target)
    return member


def op_write(req: dict, payload: bytes) -> dict:
    """Write ``payload`` to ``path`` at ``offset`` (made with ``mode``; truncated unless told not)."""
    path = req["path"]
    os.makedirs(posixpath.dirname(path) or "/", exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if req.get("truncate", True) else 0)
    fd = os.open(path, flags, req.get("mode", 0o644))
    try:
        os.lseek(fd, req.get("offset", 0), os.SEEK_SET)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
        if "mode" in req:
            os.fchmod(fd, req["mode"])
    finally:
        os.close(fd)
    return {"size": len(payload)}


def op_read(req: dict, payload: bytes) -> tuple[dict, bytes]:
    """Up to ``length`` bytes of ``path`` from ``offset``, and its size."""
    fd = os.open(req["path"], os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        os.lseek(fd, req.get("offset", 0), os.SEEK_SET)
        want, chunks = req.get("length", 1 << 24), []
        while want > 0:
            chunk = os.read(fd, min(want, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            want -= len(chunk)
    finally:
        os.close(fd)
    return {"size": st.st_size}, b"".join(chunks)


def op_stat(req: dict, payload: bytes) -> dict:
    """Whether ``path`` exists, and its type, size and mode."""
    try:
        st = os.stat(req["path"])
    except FileNotFoundError:
        return {"exists": False}
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return {"exists": True, "type": kind, "size": st.st_size, "mode": stat.S_IMODE(st.st_mode)}


def op_tar_in(req: dict, payload: bytes) -> dict:
    """Unpack the uploaded tar ``payload`` into ``path``."""
    extract_tar(payload, req["path"])
    return {}


def op_tar_out(req: dict, payload: bytes) -> tuple[dict, bytes]:
    """``path`` (a file or a tree) as a tar."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        tar.add(req["path"], arcname=".", recursive=True)
    return {}, buf.getvalue()


# The operations of the protocol this module answers: op name -> handler(request, payload).
OPS = {"write": op_write, "read": op_read, "stat": op_stat, "tar_in": op_tar_in, "tar_out": op_tar_out}
