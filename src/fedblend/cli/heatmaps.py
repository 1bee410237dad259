"""FedAPA's aggregation weights as pictures and numbers (reporting, so here and not in the method module):
heatmaps of the weight matrix snapshots a run keeps in its checkpoint (``heatmap_rounds``), and how much weight
goes to clients that share a class (``scripts/fedapa_heatmap.py``, docs/methods/fedapa.md)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from fedblend.algorithms.fedapa import FedAPA, FedAPAOptions
from fedblend.common.optional import pyplot


def same_class_mass(weights: torch.Tensor, train_counts: Sequence[Sequence[int]]) -> dict[str, float]:
    """How much of each client's weight on *other* clients goes to clients that share a class with it.

    ``shares(i, j)``: clients i and j both hold training samples of at least one common class. Returns the mean
    over clients of ``sum_{j != i, shares} a_ij / sum_{j != i} a_ij`` (clients with no off-diagonal mass are
    left out), the same for a uniform row (the chance level), and the mean self-weight.
    """
    w = torch.as_tensor(weights, dtype=torch.float64)
    has = torch.as_tensor(train_counts) > 0
    share = (has.double() @ has.double().T) > 0
    eye = torch.eye(w.shape[0], dtype=torch.bool)
    off = w.masked_fill(eye, 0.0)
    total = off.sum(1)
    ok = total > 0
    mass = (off * share).sum(1)[ok] / total[ok]
    chance = ((share & ~eye).sum(1).double() / (w.shape[0] - 1))[ok]
    return {"same_class_mass": float(mass.mean()) if ok.any() else float("nan"),
            "chance_level": float(chance.mean()) if ok.any() else float("nan"),
            "mean_self_weight": float(w.diagonal().mean())}


# ------------------------------------------------------------------------------------------------ heatmaps
def save_heatmap(matrix: torch.Tensor, path: str | Path, title: str = "") -> Path:
    """Write the aggregation-weight matrix (row i = weights client i's model is built from) as a PNG."""
    plt = pyplot("the heatmaps")

    m = matrix.detach().cpu().float().numpy()
    n = m.shape[0]
    fig, ax = plt.subplots(figsize=(1.0 + 0.3 * n, 0.8 + 0.3 * n))
    im = ax.imshow(m, cmap="viridis", vmin=0.0, vmax=max(1e-12, float(m.max())))
    ax.set_xlabel("client j (contributes)")
    ax.set_ylabel("client i (receives)")
    ticks = list(range(0, n, max(1, n // 20)))
    ax.set_xticks(ticks)
    ax.set_yticks(ticks)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="a_ij")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def heatmaps_from_checkpoint(run_dir: str | Path, out_dir: str | Path | None = None,
                             rounds: Sequence[int] | None = None) -> list[Path]:
    """Heatmaps of a FedAPA run: one per snapshot in ``checkpoint.pt`` (``heatmap_rounds``) plus the latest."""
    from fedblend.core.checkpoint import FILENAME, load_checkpoint

    run_dir = Path(run_dir)
    ck = load_checkpoint(run_dir / FILENAME)
    server = ck["server"]
    if "weights" not in server:
        raise ValueError(f"{run_dir}: checkpoint has no FedAPA weight matrix (server keys: {sorted(server)})")
    out = Path(out_dir) if out_dir is not None else run_dir
    out.mkdir(parents=True, exist_ok=True)
    snaps = dict(server.get("snapshots", {}))
    if rounds is not None:
        snaps = {r: v for r, v in snaps.items() if r in set(rounds)}
    paths = [save_heatmap(w, out / f"fedapa_weights_round{r:04d}.png", f"FedAPA aggregation weights, round {r}")
             for r, w in sorted(snaps.items())]
    opts = _options_from_run(run_dir)
    latest = FedAPA(opts).effective_weights(server) if opts is not None else server["weights"]
    paths.append(save_heatmap(latest, out / "fedapa_weights_latest.png",
                              f"FedAPA aggregation weights after round {ck['next_round']}"))
    return paths


def _options_from_run(run_dir: Path) -> FedAPAOptions | None:
    cfg = run_dir / "config.toml"
    if not cfg.exists():
        return None
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from fedblend.common.options import from_table

    raw = tomllib.loads(cfg.read_text())
    return from_table(FedAPAOptions, raw.get("options", {}), "options")
