"""FedALP diagnostics of a finished (or checkpointed) run.

    python scripts/fedalp_plots.py RUN_DIR [--out DIR]

Reads RUN_DIR/checkpoint.pt (the server state keeps every clustering) and RUN_DIR/partition.json (per-client
class counts) and writes, per clustering ``i``, into DIR (default RUN_DIR):

* ``fedalp_clustering.json``  group of each client vs its dominant class, adjusted Rand index, group-by-class
  table, per-group layer weights Psi_m and delta_m / max(delta_m);
* ``fedalp_similarity_<i>.png``  the cosine-similarity matrix rho ordered by group then dominant class;
* ``fedalp_psi_<i>.png``  the per-group layer weights.

matplotlib is needed only for the PNGs (the JSON is written without it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from fedblend.algorithms.fedalp.clustering import clustering_report
from fedblend.core.checkpoint import FILENAME, load_checkpoint


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    run = Path(args.run_dir)
    out = Path(args.out) if args.out else run
    out.mkdir(parents=True, exist_ok=True)
    ck = load_checkpoint(run / FILENAME)
    counts = json.loads((run / "partition.json").read_text())["train_counts"]
    records = ck["server"].get("clusterings") or []
    if not records:
        print(f"{run}: no clustering yet (the run stopped before T_pre, or is not a FedALP run)", file=sys.stderr)
        return 1
    reports = [clustering_report(r, counts) for r in records]
    (out / "fedalp_clustering.json").write_text(json.dumps({"clusterings": reports}, indent=1) + "\n")
    for i, rep in enumerate(reports):
        print(f"clustering {i} (after round {rep['round']}): {len(rep['group_sizes'])} groups, sizes "
              f"{rep['group_sizes']}, ARI vs dominant class {rep['ari_vs_dominant_class']:.3f}")
        for m, psi in enumerate(rep["psi"]):
            print(f"  group {m}: Psi " + ", ".join(f"{k}={v:.3f}" for k, v in psi.items()))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: wrote the JSON only", file=sys.stderr)
        return 0
    for i, (rec, rep) in enumerate(zip(records, reports)):
        rho = rec["rho"].numpy() if hasattr(rec["rho"], "numpy") else np.asarray(rec["rho"])
        pos = {c: j for j, c in enumerate(rep["clients"])}
        order = [pos[c] for c in rep["order_by_group"]]
        fig, ax = plt.subplots(figsize=(6.5, 5.5))
        im = ax.imshow(rho[np.ix_(order, order)], cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
        labels = np.asarray(rep["group"])[order]
        for b in np.flatnonzero(np.diff(labels)) + 0.5:
            ax.axhline(b, color="k", lw=0.6)
            ax.axvline(b, color="k", lw=0.6)
        ax.set_title(f"FedALP cosine similarity of updates, round {rep['round']}\n"
                     f"ordered by group (lines) then dominant class; ARI {rep['ari_vs_dominant_class']:.3f}")
        ax.set_xlabel("client (ordered)")
        ax.set_ylabel("client (ordered)")
        fig.colorbar(im, ax=ax, label="rho")
        fig.tight_layout()
        fig.savefig(out / f"fedalp_similarity_{i}.png", dpi=120)
        plt.close(fig)
        layers = list(rep["psi"][0])
        fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(rep["psi"]) * len(layers)), 4.0))
        width = 0.8 / len(layers)
        for j, ly in enumerate(layers):
            ax.bar(np.arange(len(rep["psi"])) + (j - (len(layers) - 1) / 2) * width, [p[ly] for p in rep["psi"]], width, label=ly)
        ax.set_xticks(np.arange(len(rep["psi"])))
        ax.set_xlabel("group")
        ax.set_ylabel("Psi_m")
        ax.set_title(f"FedALP layer weight of each group's model (Psi_m), clustering after round {rep['round']}",
                     fontsize=10)
        ax.set_ylim(0, 1)
        ax.legend(fontsize=8, loc="upper right")
        fig.tight_layout()
        fig.savefig(out / f"fedalp_psi_{i}.png", dpi=120)
        plt.close(fig)
    print(f"wrote {out}/fedalp_clustering.json and PNGs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
