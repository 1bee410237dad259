"""pFedRLLA's agent file: the embedding network and the DDPG agent of a (pre-training) run, written by
``fedblend pretrain`` and read by ``options.agent`` (paper App. D-E)."""

from __future__ import annotations

from pathlib import Path

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


def load_agent(path: str | Path) -> dict:
    from fedblend.core.checkpoint import load_checkpoint

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"options.agent: no agent file at {path} (make one with `fedblend pretrain`)")
    data = load_checkpoint(path)
    if data.get("format") != AGENT_FORMAT:
        raise ValueError(f"{path} is not a pFedRLLA agent file (format {data.get('format')!r})")
    return data
