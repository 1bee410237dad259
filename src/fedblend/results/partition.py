"""A partition's picture: ``partition.png`` of ``fedblend partition --out``: the train samples per
client and class as a bubble chart."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedblend.common.optional import pyplot
from fedblend.data.federated import FederatedData


def plot_counts(fed: FederatedData, path: str | Path) -> None:
    """Per-client class counts as a bubble chart PNG (needs matplotlib): integer client / class ticks, a legend
    of bubble sizes, and a width that stops growing at about 45 clients (16 inches; ticks thin out)."""
    plt = pyplot("partition.png")
    from matplotlib.ticker import MaxNLocator

    counts = fed.counts["train"]
    k, c = np.nonzero(counts)
    top = max(int(counts.max()), 1)
    scale = 300 / top
    fig, ax = plt.subplots(figsize=(min(max(5.0, 0.3 * fed.num_clients + 3), 16.0), max(3.5, 0.35 * counts.shape[1] + 1.5)))
    ax.scatter(k, c, s=scale * counts[k, c], alpha=0.6)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True, nbins=min(40, max(fed.num_clients, counts.shape[1]))))
    ax.set_ylim(-0.7, counts.shape[1] - 0.3)
    ax.set_xlim(-0.7, fed.num_clients - 0.3)
    sizes = sorted({max(1, int(round(top * f, -len(str(int(top * f))) + 1))) for f in (0.1, 0.5, 1.0)})
    handles = [ax.scatter([], [], s=scale * n, alpha=0.6, color="tab:blue") for n in sizes]
    ax.legend(handles, [f"{n:,}" for n in sizes], title="samples", loc="upper left", bbox_to_anchor=(1.01, 1.0),
              labelspacing=1.3, borderpad=1.0, frameon=False, fontsize=8)
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    ax.set_title(f"{fed.info['name']}: {fed.spec.kind} ({fed.spec.rule}) - train samples per client and class",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
