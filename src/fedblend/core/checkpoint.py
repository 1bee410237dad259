"""Checkpoints: the whole run state (round, server state, client store, metric history) on disk.

Written atomically (temporary file then rename), so a run killed while saving keeps the previous checkpoint.
Because every random stream is derived from (seed, round, client), resuming needs no RNG state and gives
results identical to an uninterrupted run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

FILENAME = "checkpoint.pt"


def save_checkpoint(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    return torch.load(Path(path), map_location="cpu", weights_only=False)
