"""Draw a FedAPA run's learned N x N aggregation-weight matrix as heatmap PNGs.

    python scripts/fedapa_heatmap.py RUN_DIR [--out DIR] [--rounds 1 10 50]

Reads RUN_DIR/checkpoint.pt (written every ``checkpoint_every`` rounds and at the end of a run) and writes one
PNG per snapshot kept by the ``heatmap_rounds`` option (``fedapa_weights_roundNNNN.png``) plus the matrix after
the checkpoint's last round (``fedapa_weights_latest.png``). Row i = the weights a_ij client i's personalized
feature extractor is aggregated from (paper Eq. 5). matplotlib is imported only here.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="output folder (default: RUN_DIR)")
    ap.add_argument("--rounds", nargs="*", type=int, help="only these snapshot rounds (default: all kept)")
    args = ap.parse_args(argv)
    import json
    from pathlib import Path

    from fedblend.algorithms.fedapa import FedAPA
    from fedblend.cli.heatmaps import heatmaps_from_checkpoint, same_class_mass
    from fedblend.core.checkpoint import FILENAME, load_checkpoint

    for p in heatmaps_from_checkpoint(args.run_dir, args.out, args.rounds):
        print(p)
    part = Path(args.run_dir) / "partition.json"
    if part.exists():
        server = load_checkpoint(Path(args.run_dir) / FILENAME)["server"]
        counts = json.loads(part.read_text())["train_counts"]
        print(json.dumps(same_class_mass(FedAPA().effective_weights(server), counts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
