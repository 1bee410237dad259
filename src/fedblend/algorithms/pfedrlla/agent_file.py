"""pFedRLLA's agent file: the embedding network and the DDPG agent of a (pre-training) run, written by
``fedblend pretrain`` and read by ``options.agent`` (paper App. D-E)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedblend.common.errors import CheckpointError, UserFileError

AGENT_FORMAT = "fedblend-pfedrlla-agent/1"
State = dict


def save_agent(server: State, path: str | Path) -> Path:
    """Write the embedding network and the agent (weights, Adam moments, replay buffer) of a run to ``path``."""
    from fedblend.core.checkpoint import save_checkpoint

    if server.get("agent") is None or server.get("embed") is None:
        raise ValueError("this pFedRLLA server state has no trained agent (head_weights = 'agent' and at least "
                         "one round are needed)")
    path = Path(path)
    save_checkpoint(path, {"format": AGENT_FORMAT, "embed": server["embed"], "agent": server["agent"]})
    return path


class AgentFileError(UserFileError):
    """An agent file (``options.agent``) that cannot serve this run: names the file, what differs and the fix."""


class AgentFileMissingError(AgentFileError, FileNotFoundError):
    pass


AGENT_FIX = "make one with `fedblend pretrain` for the same model, clients per round and embedding options"


def load_agent(path: str | Path) -> dict:
    from fedblend.core.checkpoint import load_checkpoint

    path = Path(path)
    if not path.is_file():
        raise AgentFileMissingError(f"options.agent: no agent file at {path} (make one with `fedblend pretrain`)")
    try:
        data = load_checkpoint(path)
    except CheckpointError as exc:
        raise AgentFileError(f"options.agent = {str(path)!r} is not a readable agent file ({exc.__cause__ or exc}); "
                             f"{AGENT_FIX}") from exc
    if not isinstance(data, dict) or data.get("format") != AGENT_FORMAT:
        fmt = data.get("format") if isinstance(data, dict) else None
        raise AgentFileError(f"options.agent = {str(path)!r} is not a pFedRLLA agent file (format {fmt!r}, expected "
                             f"{AGENT_FORMAT!r}); {AGENT_FIX}")
    for key in ("embed", "agent"):
        if not isinstance(data.get(key), dict):
            raise AgentFileError(f"options.agent = {str(path)!r} has no {key!r} network; {AGENT_FIX}")
    return data


def shape_mismatch(want: Any, got: Any, path: str = "", free: tuple[str, ...] = ()) -> str | None:
    """Where ``got`` differs from ``want`` in structure (keys, list lengths, types) or tensor shape, as text; the
    first dimension of tensors whose path starts with one of ``free`` may differ (a replay buffer's length)."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path}: a {type(got).__name__}, expected a tensor of shape {tuple(want.shape)}"
        w, g = tuple(want.shape), tuple(got.shape)
        if path.startswith(free) and len(w) == len(g) and w[1:] == g[1:]:
            return None
        return None if w == g else f"{path}: shape {g}, expected {w}"
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(want) != set(got):
            keys = sorted(map(str, got)) if isinstance(got, dict) else type(got).__name__
            return f"{path or 'the file'}: holds {keys}, expected {sorted(map(str, want))}"
        return next((m for k in want if (m := shape_mismatch(want[k], got[k], f"{path}.{k}" if path else k, free))),
                    None)
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(want) != len(got):
            return f"{path}: {len(got) if isinstance(got, (list, tuple)) else type(got).__name__} entries, expected {len(want)}"
        return next((m for i, (a, b) in enumerate(zip(want, got)) if (m := shape_mismatch(a, b, f"{path}[{i}]", free))),
                    None)
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return None if isinstance(got, (int, float)) and not isinstance(got, bool) else f"{path}: {got!r}, expected a number"
    return None
