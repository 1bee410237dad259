"""The client-state store: every client's state is data keyed by client id, owned by the runtime.

Client halves receive their state and return the new one; nothing is kept inside per-client objects. A client
that has never been contacted has no entry (``get`` returns ``None``): its client half initialises its state on
the client at first contact (``Method.init_client``).

* :class:`ClientStore` keeps states in memory (the default, ``store = "memory"``).
* :class:`DiskStore` keeps one file per client (the state codec's named arrays, ``torch.save``), so a run with
  thousands of clients holds in memory only the states of the clients in the round. Files are replaced
  atomically (written under a temporary name, then renamed), and a checkpoint is a directory of hard links to
  the files of that moment: later writes make new files, so the snapshot keeps its content without a copy.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import decode, encode

State = dict[str, Any]
DISK_SNAPSHOT = "__disk_snapshot__"


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

    def checkpoint(self, ck_dir: Path) -> Any:
        """What the checkpoint keeps of the store (here: every state)."""
        return self.states

    def restore(self, saved: Any, ck_dir: Path) -> None:
        """The states of a checkpoint (also one written by a disk store: its snapshot files are read in)."""
        if isinstance(saved, dict) and DISK_SNAPSHOT in saved:
            files = (Path(ck_dir) / saved[DISK_SNAPSHOT]).glob("*.pt")
            saved = {int(f.stem): decode(torch.load(f, map_location="cpu", weights_only=True)) for f in files}
        self.states = dict(saved)


class DiskStore(ClientStore):
    """One file per client under ``root`` (``<cid>.pt``); ``device`` is where loaded tensors go."""

    def __init__(self, root: str | Path, device: str = "cpu"):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.device = device

    def _path(self, cid: int) -> Path:
        return self.root / f"{int(cid)}.pt"

    def get(self, cid: int) -> State | None:
        p = self._path(cid)
        if not p.exists():
            return None
        return decode(torch.load(p, map_location="cpu", weights_only=True), self.device)

    def put(self, cid: int, state: State) -> None:
        p = self._path(cid)
        tmp = p.with_suffix(".tmp")
        torch.save(encode(state), tmp)
        os.replace(tmp, p)  # a new file: hard links in a snapshot keep the old content

    def __contains__(self, cid: int) -> bool:
        return self._path(cid).exists()

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(int(p.stem) for p in self.root.glob("*.pt")))

    @property
    def states(self) -> dict[int, State]:
        """Every stored state, loaded (for tests and small runs; a large run never needs this)."""
        return {cid: self.get(cid) for cid in self}

    def bytes_per_client(self) -> float:
        files = list(self.root.glob("*.pt"))
        return sum(f.stat().st_size for f in files) / max(1, len(files))

    def checkpoint(self, ck_dir: Path) -> Any:
        """Hard-link every client file into ``ck_dir/clients.ckpt`` (replacing the previous snapshot)."""
        snap = Path(ck_dir) / "clients.ckpt"
        tmp = Path(ck_dir) / "clients.ckpt.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for cid in self:
            os.link(self._path(cid), tmp / f"{cid}.pt")
        shutil.rmtree(snap, ignore_errors=True)
        os.replace(tmp, snap)
        return {DISK_SNAPSHOT: snap.name}

    def restore(self, saved: Any, ck_dir: Path) -> None:
        """Make the live files those of the snapshot (a checkpoint of a memory store is written out)."""
        for p in self.root.glob("*.pt"):
            p.unlink()
        if isinstance(saved, dict) and DISK_SNAPSHOT in saved:
            for f in (Path(ck_dir) / saved[DISK_SNAPSHOT]).glob("*.pt"):
                os.link(f, self.root / f.name)
        else:
            for cid, st in dict(saved).items():
                self.put(cid, st)
