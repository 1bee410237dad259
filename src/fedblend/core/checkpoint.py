"""Checkpoints: the whole run state (round, server state, client store, metric history) on disk.

The state is flattened by the one state codec (:mod:`fedblend.common.codec`) into named arrays and written with
``torch.save``; loading uses ``weights_only=True`` (no code can run from a checkpoint file). Written atomically
(:func:`fedblend.common.files.write_atomic`: temporary file, fsync, rename), so a run killed while saving, or a
disk that fills, keeps the previous checkpoint and leaves no temporary file. ``checkpoint.pt`` is the one pointer
of a checkpoint: what else belongs to it (a disk store's client snapshot, ``partition.json``) is named in it with
content hashes, and ``--resume`` refuses files that do not match (:mod:`fedblend.core.state`,
:func:`fedblend.experiment.check_resume`). Because every random stream is derived from (seed, round, client),
resuming needs no RNG state and gives results identical to an uninterrupted run.

A run's checkpoint is itself checked by content: :func:`save_checkpoint` with ``record_hash`` writes the sha256
of the bytes it saved beside it, in ``checkpoint.pt.sha256`` (``sha256sum`` format), and ``--resume`` runs
:func:`verify_checkpoint` before reading it, so a bit flipped on the disk is refused instead of resuming into
silently different rounds. The two files cannot be replaced together, so the record is written in two steps:
before ``checkpoint.pt`` is replaced it lists the new hash and the old one, afterwards the new one only; a run
killed between any two steps leaves a checkpoint whose hash is listed. A checkpoint without a record (an older
fedblend's) resumes with a warning.
"""

from __future__ import annotations

import hashlib
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import TREE, decode, encode
from fedblend.common.errors import CheckpointDamagedError, CheckpointError, CheckpointMissingError
from fedblend.common.files import save_tensors, sha256_file, tensor_bytes, write_atomic

FILENAME = "checkpoint.pt"
HASH_SUFFIX = ".sha256"
_LINE = re.compile(r"([0-9a-f]{64})  (\S+)")


def hash_path(path: str | Path) -> Path:
    """Where the sha256 of the checkpoint at ``path`` is recorded (``checkpoint.pt.sha256``)."""
    path = Path(path)
    return path.with_name(path.name + HASH_SUFFIX)


def save_checkpoint(path: str | Path, payload: dict[str, Any], record_hash: bool = False) -> None:
    """Save ``payload`` to ``path`` atomically; ``record_hash``: also record its sha256 (module docstring)."""
    if not record_hash:
        save_tensors(encode(payload), path)
        return
    path = Path(path)
    data = tensor_bytes(encode(payload))
    new = hashlib.sha256(data).hexdigest()
    try:
        old = recorded_hashes(path) if path.is_file() else []
    except CheckpointDamagedError:
        old = []
    _write_record(path, [new, *old[:1]])  # the old checkpoint stays valid until the rename below
    write_atomic(path, data)
    _write_record(path, [new])


def _write_record(path: Path, hashes: list[str]) -> None:
    write_atomic(hash_path(path), "".join(f"{h}  {path.name}\n" for h in hashes).encode())


def recorded_hashes(path: str | Path) -> list[str]:
    """The sha256 values recorded for the checkpoint at ``path`` ([] when none is recorded);
    :class:`CheckpointDamagedError` when the record itself is not one."""
    path, rec = Path(path), hash_path(path)
    if not rec.is_file():
        return []
    try:
        lines = rec.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    found = [_LINE.fullmatch(line) for line in lines]
    if not found or not all(m and m.group(2) == path.name for m in found):
        raise CheckpointDamagedError(f"--resume: {rec} is damaged (not a sha256 record of {path.name}), so "
                                     f"{path.name} cannot be checked; rerun with --force to start over")
    return [m.group(1) for m in found if m]


def verify_checkpoint(path: str | Path) -> None:
    """Refuse (:class:`CheckpointDamagedError`) a checkpoint whose bytes do not hash to a recorded sha256; warn
    when none is recorded (written by an older fedblend), so old runs still resume."""
    path = Path(path)
    want = recorded_hashes(path)
    if not want:
        warnings.warn(f"{path} has no recorded sha256 (written by an older fedblend): resuming without checking "
                      f"its content", RuntimeWarning, stacklevel=2)
        return
    got = sha256_file(path)
    if got not in want:
        raise CheckpointDamagedError(f"--resume: {path.name} is damaged: its sha256 {got[:12]}... does not match the "
                                     f"one recorded when it was written ({want[0][:12]}... in {hash_path(path)}); "
                                     f"rerun with --force to start over")


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The run state saved at ``path``; :class:`CheckpointError` when it is missing, unreadable or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointMissingError(f"no checkpoint at {path}")
    try:
        arrays = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(arrays, dict) or TREE not in arrays:
            raise ValueError("no state tree")
        return decode(arrays, "cpu")
    except Exception as exc:  # torch raises RuntimeError, pickle / zip / json errors for damaged files
        raise CheckpointError(f"{path} is not a readable fedblend checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else 'corrupt'})") from exc
