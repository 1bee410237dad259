"""Checkpoints: the whole run state (round, server state, client store, metric history) on disk.

The state is flattened by the one state codec (:mod:`fedblend.common.codec`) into named arrays and written with
``torch.save``; loading uses ``weights_only=True`` (no code can run from a checkpoint file). Written atomically
(:func:`fedblend.common.files.write_atomic`: temporary file, fsync, rename), so a run killed while saving, or a
disk that fills, keeps the previous checkpoint and leaves no temporary file. ``checkpoint.pt`` is the one pointer
of a checkpoint: what else belongs to it (a disk store's client snapshot, ``partition.json``) is named in it with
content hashes, and ``--resume`` refuses files that do not match (:mod:`fedblend.core.state`,
:func:`fedblend.experiment.check_resume`). Because every random stream is derived from (seed, round, client),
resuming needs no RNG state and gives results identical to an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import TREE, decode, encode
from fedblend.common.errors import CheckpointError, CheckpointMissingError
from fedblend.common.files import save_tensors

FILENAME = "checkpoint.pt"


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    save_tensors(encode(payload), path)


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
