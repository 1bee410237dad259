"""``fedblend export FORMAT RUN_DIR [--out DIR]``: a finished run's metrics to a tracker's files (TensorBoard,
MLflow, wandb offline), replacing an earlier export."""

from __future__ import annotations

import argparse

from fedblend.cli import args as cli_args


def add_parser(sub) -> None:
    ex = sub.add_parser("export", help="export a finished run to a tracker: tensorboard, mlflow, wandb (offline); "
                                       "exporting again replaces the earlier export")
    ex.add_argument("format", choices=["tensorboard", "mlflow", "wandb"])
    ex.add_argument("run_dir", help="a run directory (holding metrics.jsonl)")
    ex.add_argument("--out", help="where to write (default RUN_DIR/tensorboard, RUN_DIR/mlruns, RUN_DIR/wandb)")
    cli_args.debug(ex)


def command(args: argparse.Namespace) -> int:
    from fedblend.tracking import export_run

    print(f"wrote {export_run(args.format, args.run_dir, args.out)}")
    return 0
