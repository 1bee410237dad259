"""The client-state store: every client's state is data keyed by client id, owned by the runtime.

Client halves receive their state and return the new one; nothing is kept inside per-client objects. A client
that has never been contacted has no entry (``get`` returns ``None``): its client half initialises its state on
the client at first contact (``Method.init_client``).

* :class:`ClientStore` keeps states in memory (the default, ``store = "memory"``); a checkpoint holds them all
  inside ``checkpoint.pt``.
* :class:`DiskStore` keeps one file per client (the state codec's named arrays, ``torch.save``), so a run with
  thousands of clients holds in memory only the states of the clients in the round. Files are replaced
  atomically (:func:`fedblend.common.files.save_tensors`), so a later write makes a new file.

A disk store's checkpoint is a new snapshot directory ``clients.ckpt/round<N>-<id>/`` of hard links to the files
of that moment (no copy), named in ``checkpoint.pt`` together with the sha256 of every file in it (the
manifest). ``checkpoint.pt`` is the one pointer: it is replaced atomically *after* the snapshot is complete, and
older snapshots are removed only after that, so a failure at any file boundary leaves the previous checkpoint
whole (the unfinished snapshot is removed). Restoring checks the snapshot against the manifest first and
refuses (:class:`~fedblend.common.errors.CheckpointMismatchError`) a missing, extra or changed file, instead of
continuing with a fresh state for a client.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fedblend.common import files
from fedblend.common.codec import decode, encode
from fedblend.common.errors import CheckpointMismatchError, FedblendError

State = dict[str, Any]
DISK_SNAPSHOT = "__disk_snapshot__"
MANIFEST = "__files__"  # {"<cid>.pt": sha256} of a disk snapshot
SNAPSHOTS = "clients.ckpt"


class StoreError(FedblendError):
    """A client-state file the store wrote is gone or unreadable during a run (the run stops; --resume continues
    from the last checkpoint)."""


class ClientStore:
    """States in memory (``states``: ``{cid: state}``)."""

    def __init__(self, states: dict[int, State] | None = None):
        self.states: dict[int, State] = dict(states or {})

    def get(self, cid: int) -> State | None:
        return self.states.get(cid)

    def put(self, cid: int, state: State) -> None:
        self.states[cid] = state

    def __contains__(self, cid: int) -> bool:
        return cid in self.states

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.states))

    def checkpoint(self, ck_dir: Path, rnd: int = 0) -> Any:
        """What the checkpoint keeps of the store (here: every state)."""
        return self.states

    def discard(self, ck_dir: Path, saved: Any) -> None:
        """The checkpoint that ``saved`` was made for failed: remove what :meth:`checkpoint` wrote for it."""

    def commit(self, ck_dir: Path, saved: Any) -> None:
        """The checkpoint holding ``saved`` is in place: remove what older checkpoints left."""

    def restore(self, saved: Any, ck_dir: Path) -> None:
        """The states of a checkpoint (also one written by a disk store: its snapshot files are checked against
        the checkpoint's manifest and read in)."""
        if is_snapshot(saved):
            files_ = verify_snapshot(saved, ck_dir)
            saved = {int(f.stem): decode(torch.load(f, map_location="cpu", weights_only=True)) for f in files_}
        self.states = dict(saved)


def is_snapshot(saved: Any) -> bool:
    return isinstance(saved, dict) and DISK_SNAPSHOT in saved


def verify_snapshot(saved: dict, ck_dir: Path) -> list[Path]:
    """The files of the disk snapshot a checkpoint names, after checking them against its manifest (sha256 of
    every file; nothing missing, nothing extra). Checkpoints written before manifests existed are taken as they
    are. :class:`CheckpointMismatchError` names the first file that does not match."""
    snap = Path(ck_dir) / saved[DISK_SNAPSHOT]
    fix = ("the checkpoint's client states are not the ones it was written with, so resuming would not continue "
           "the same run: restore the file, or start again with --force")
    if not snap.is_dir():
        raise CheckpointMismatchError(f"--resume: {snap}, the client-state snapshot that {Path(ck_dir) / 'checkpoint.pt'} "
                                      f"names, is missing; {fix}")
    present = sorted(p for p in snap.iterdir())
    manifest = saved.get(MANIFEST)
    if manifest is None:  # an older fedblend: no hashes to check
        return [p for p in present if p.suffix == ".pt"]
    names = {p.name for p in present}
    for name in sorted(set(manifest) - names):
        raise CheckpointMismatchError(f"--resume: client-state file {snap / name} is missing; {fix}")
    for name in sorted(names - set(manifest)):
        raise CheckpointMismatchError(f"--resume: {snap / name} is not part of the checkpoint (an extra file); "
                                      f"remove it, or start again with --force")
    for p in present:
        if files.sha256_file(p) != manifest[p.name]:
            raise CheckpointMismatchError(f"--resume: client-state file {p} changed since the checkpoint was "
                                          f"written (sha256 differs); {fix}")
    return present


class DiskStore(ClientStore):
    """One file per client under ``root`` (``<cid>.pt``); ``device`` is where loaded tensors go."""

    def __init__(self, root: str | Path, device: str = "cpu"):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.device = device
        self.known = {int(p.stem) for p in self.root.glob("*.pt")}  # clients whose state is on disk

    def _path(self, cid: int) -> Path:
        return self.root / f"{int(cid)}.pt"

    def get(self, cid: int) -> State | None:
        p = self._path(cid)
        if not p.exists():
            if cid in self.known:  # never silently a fresh state for a client that has one
                raise StoreError(f"{p}, client {cid}'s state, disappeared during the run; the run stopped: "
                                 f"continue from its last checkpoint with --resume")
            return None
        try:
            return decode(torch.load(p, map_location="cpu", weights_only=True), self.device)
        except Exception as exc:  # torch: RuntimeError / pickle errors for a damaged file
            raise StoreError(f"{p}, client {cid}'s state, cannot be read ({type(exc).__name__}); the run stopped: "
                             f"continue from its last checkpoint with --resume") from exc

    def put(self, cid: int, state: State) -> None:
        files.save_tensors(encode(state), self._path(cid))  # a new file: links in a snapshot keep the old one
        self.known.add(int(cid))

    def __contains__(self, cid: int) -> bool:
        return self._path(cid).exists()

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(int(p.stem) for p in self.root.glob("*.pt")))

    @property
    def states(self) -> dict[int, State]:
        """Every stored state, loaded (for tests and small runs; a large run never needs this)."""
        return {cid: self.get(cid) for cid in self}

    def bytes_per_client(self) -> float:
        files_ = list(self.root.glob("*.pt"))
        return sum(f.stat().st_size for f in files_) / max(1, len(files_))

    def checkpoint(self, ck_dir: Path, rnd: int = 0) -> Any:
        """A new snapshot directory ``ck_dir/clients.ckpt/round<rnd>-<id>`` of hard links to every client file,
        and its manifest (see the module docstring). On a failure the unfinished snapshot is removed."""
        base = Path(ck_dir) / SNAPSHOTS
        name = f"round{rnd}-{secrets.token_hex(4)}"
        tmp, snap = base / f"{name}.tmp", base / name
        manifest: dict[str, str] = {}
        try:
            files.make_dir(tmp)
            for cid in self:
                files.link(self._path(cid), tmp / f"{cid}.pt")
                manifest[f"{cid}.pt"] = files.sha256_file(tmp / f"{cid}.pt", sync=True)
            files.fsync_dir(tmp)
            files.replace(tmp, snap)
            files.fsync_dir(base)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(snap, ignore_errors=True)
            if isinstance(exc, OSError) and not isinstance(exc, files.WriteError):
                raise files.WriteError(snap, exc) from exc
            raise
        return {DISK_SNAPSHOT: f"{SNAPSHOTS}/{name}", MANIFEST: manifest}

    def discard(self, ck_dir: Path, saved: Any) -> None:
        if is_snapshot(saved):
            shutil.rmtree(Path(ck_dir) / saved[DISK_SNAPSHOT], ignore_errors=True)

    def commit(self, ck_dir: Path, saved: Any) -> None:
        """Remove every snapshot but the one ``checkpoint.pt`` now names (older ones, unfinished ones)."""
        prune_snapshots(Path(ck_dir), saved)

    def restore(self, saved: Any, ck_dir: Path) -> None:
        """Make the live files those of the snapshot, after checking it (a checkpoint of a memory store is
        written out)."""
        snap_files = verify_snapshot(saved, ck_dir) if is_snapshot(saved) else None
        for p in self.root.glob("*.pt"):
            p.unlink()
        self.known = set()
        if snap_files is not None:
            for f in snap_files:
                files.link(f, self.root / f.name)
                self.known.add(int(f.stem))
        else:
            for cid, st in dict(saved).items():
                self.put(cid, st)


def prune_snapshots(ck_dir: Path, keep: Any) -> None:
    """Remove every client snapshot under ``ck_dir`` but the one ``keep`` names (``keep`` not a disk snapshot:
    remove them all, e.g. a run that switched to the memory store)."""
    base = Path(ck_dir) / SNAPSHOTS
    if not base.is_dir():
        return
    kept = (Path(ck_dir) / keep[DISK_SNAPSHOT]).resolve() if is_snapshot(keep) else None
    if kept is not None and kept == base.resolve():  # an older fedblend's snapshot: the files are the snapshot
        return
    for p in base.iterdir():
        if kept is None or p.resolve() != kept:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
