"""Checkpoints: the whole run state (round, server state, client store, metric history) on disk.

The state is flattened by the one state codec (:mod:`fedblend.common.codec`) into named arrays and written with
``torch.save``; loading uses ``weights_only=True`` (no code can run from a checkpoint file). Written atomically
(temporary file then rename), so a run killed while saving keeps the previous checkpoint. Because every random
stream is derived from (seed, round, client), resuming needs no RNG state and gives results identical to an
uninterrupted run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import TREE, decode, encode
from fedblend.common.errors import CheckpointError, CheckpointMissingError

FILENAME = "checkpoint.pt"


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    torch.save(encode(payload), tmp)
    os.replace(tmp, path)


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
