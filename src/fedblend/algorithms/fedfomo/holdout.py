"""A client's own validation data cut from its training split (FedFomo Eq. 6-7: ``L_i`` is scored on data the
client does not train on): which rows are held out, and the client's data seen through that cut."""

from __future__ import annotations

import torch

from fedblend.data.federated import ClientData


def holdout_rows(n: int, fraction: float, pick: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a client's ``n`` training samples it keeps for training and those it holds out as its
    validation data (Eq. 6-7: ``L_i`` on validation data the client does not train on): ``floor(fraction *
    n)`` held out, ``"random"``: a uniformly random subset drawn from ``generator`` (the authors' ``random_split``),
    ``"last"``: the last rows (PFLlib's ``train_data[-int(0.2 n):]``). Both index tensors ascending; disjoint,
    together ``range(n)``."""
    held = int(fraction * n)
    if pick == "last":
        order = torch.arange(n)
    elif pick == "random":
        order = torch.randperm(n, generator=generator)
    else:
        raise ValueError(f"holdout_pick must be 'random' or 'last', got {pick!r}")
    keep, out = order[: n - held], order[n - held:]
    return keep.sort().values, out.sort().values


def holdout_view(data: ClientData, keep: torch.Tensor, held: torch.Tensor) -> ClientData:
    """The client's data with its training split cut in two: ``train`` = the kept rows, ``val`` = the held-out
    rows; ``test`` unchanged."""
    return ClientData(data.train_x[keep], data.train_y[keep], data.test_x, data.test_y,
                      data.train_x[held], data.train_y[held])
