"""Draw a FedAPA run's learned N x N aggregation-weight matrix as heatmap PNGs.

    python scripts/fedapa_heatmap.py RUN_DIR [--out DIR] [--rounds 1 10 50]

The same figures as ``fedblend report RUN_DIR --diagnostics --out DIR`` (FedAPA's registered diagnostic,
:func:`fedblend.algorithms.fedapa.weight_matrices`, drawn by :mod:`fedblend.results.diagnostics`), written to one
folder: one PNG per snapshot kept by the ``heatmap_rounds`` option (``fedapa_weights_roundNNNN.png``) plus the
matrix after the checkpoint's last round (``fedapa_weights_latest.png``), read from RUN_DIR/checkpoint.pt. Row i =
the weights a_ij client i's personalized feature extractor is aggregated from (paper Eq. 5). With the run's
partition.json it prints the share of the latest matrix's off-diagonal weight that goes to clients sharing a class.
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

    from fedblend.core.diagnostics import ClientWeights
    from fedblend.results.diagnostics import render, run_items

    run = Path(args.run_dir)
    keep = {f"fedapa_weights_round{r:04d}" for r in args.rounds or ()}
    items = [i for i in run_items(run)[1] or () if isinstance(i, ClientWeights) and i.name.startswith("fedapa_weights")]
    items = [i for i in items if args.rounds is None or i.name in keep or i.name.endswith("latest")]
    values = None
    for item in items:
        _, values = render(item, run, Path(args.out) if args.out else run)
        print(Path(args.out or run) / f"{item.name}.png")
    if values:
        print(json.dumps(values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
