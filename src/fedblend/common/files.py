"""File operations of the run contract: atomic writes that leave no temporary file behind, and errors that name
the file and the fix.

Every file fedblend writes as part of a run's state (checkpoints, client-state files, agent files) goes through
:func:`write_atomic`: the bytes are written to ``NAME.tmp`` in the same directory, flushed and ``fsync``-ed,
renamed over ``NAME`` (``os.replace``, atomic on POSIX) and the directory is ``fsync``-ed, so a reader sees the
old file or the new one, never a mix. A failure (a full disk, no permission) removes the temporary file and
raises :class:`WriteError`, which keeps the ``errno`` (it is an ``OSError``) and says which file and what to
do. Tensors are serialised in memory first (:func:`save_tensors`) because ``torch.save`` to a path reports a
full disk as a ``RuntimeError`` without the ``errno``.

The primitive operations (:func:`write_file`, :func:`link`, :func:`replace`, :func:`make_dir`) are module
functions on purpose: the checkpoint tests replace them to inject a failure at every file boundary.
"""

from __future__ import annotations

import errno
import hashlib
import io
import os
from pathlib import Path
from typing import Any

from fedblend.common.errors import FedblendError

_HINTS = {
    errno.ENOSPC: "the disk is full: free space, then run again (a run continues from its last checkpoint with "
                  "--resume)",
    errno.EDQUOT: "the disk quota is exceeded: free space, then run again (--resume continues a run)",
    errno.EACCES: "no permission: choose a writable --out, or fix the permissions",
    errno.EPERM: "no permission: choose a writable --out, or fix the permissions",
    errno.EROFS: "the file system is read-only: choose another --out",
}


def hint(err: int | None) -> str:
    """What to do about an ``OSError`` with ``errno`` ``err`` ('' when there is nothing specific to say)."""
    return _HINTS.get(err or 0, "")


class WriteError(FedblendError, OSError):
    """A file could not be written (full disk, permission, read-only file system); names the file and the fix.
    An ``OSError`` with the original ``errno``."""

    def __init__(self, path: str | Path, exc: OSError):
        self.message = (f"cannot write {path}: {exc.strerror or exc}"
                        + (f" ({hint(exc.errno)})" if hint(exc.errno) else ""))
        OSError.__init__(self, exc.errno, self.message)

    def __str__(self) -> str:
        return self.message


# ------------------------------------------------------------------------------------- primitive operations
def write_file(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` (created or truncated), flushed to the disk."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def link(src: Path, dst: Path) -> None:
    os.link(src, dst)


def replace(src: Path, dst: Path) -> None:
    os.replace(src, dst)


def make_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a rename, new links) durable; a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------ composed ones
def tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def write_atomic(path: str | Path, data: bytes | memoryview) -> None:
    """Replace ``path`` by ``data`` atomically (see the module docstring); :class:`WriteError` on failure, with no
    temporary file left behind."""
    path = Path(path)
    tmp = tmp_path(path)
    try:
        write_file(tmp, data)
        replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, WriteError):
            raise
        raise WriteError(path, exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` to ``path`` (e.g. a metrics row); :class:`WriteError` on failure."""
    try:
        with open(path, "a") as f:
            f.write(text)
    except OSError as exc:
        raise WriteError(path, exc) from exc


def tensor_bytes(obj: Any) -> memoryview:
    """``torch.save`` of ``obj`` (named arrays) into memory."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getbuffer()


def save_tensors(obj: Any, path: str | Path) -> None:
    """``torch.save(obj)`` to ``path`` atomically, a full disk reported as :class:`WriteError`."""
    write_atomic(path, tensor_bytes(obj))


def sha256_tree(path: str | Path) -> str:
    """The sha256 of a file, or of a directory's files: over each file's path relative to ``path`` (sorted, ``/``
    separated) and its :func:`sha256_file`, so it changes when a file is added, removed, renamed or changed."""
    root = Path(path)
    if not root.is_dir():
        return sha256_file(root)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def sha256_file(path: str | Path, sync: bool = False) -> str:
    """The sha256 of a file's bytes (``sync``: also flush the file to the disk)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
        if sync:
            try:
                os.fsync(f.fileno())
            except OSError:
                pass
    return h.hexdigest()
