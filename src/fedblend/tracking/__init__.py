"""Metrics trackers: a run's metrics rows, as they happen, in the tools people already use.

One small interface (:class:`Tracker`: called with every metrics row, then closed), three trackers, each an
optional extra that is checked before a run starts, one module each:

* ``[log] tensorboard = true`` (:mod:`fedblend.tracking.tensorboard`) writes every metrics row of a run to
  ``OUT/tensorboard/`` (``pip install 'fedblend[tensorboard]'``). Point TensorBoard at the folder:
  ``tensorboard --logdir runs/``.
* ``[log] mlflow = true`` (:mod:`fedblend.tracking.mlflow`) logs to MLflow (``pip install 'fedblend[mlflow]'``):
  a local file store in ``OUT/mlruns`` by default, or ``[log] mlflow_uri``; at the end the summary's numbers, its
  status and the run's files (:class:`MLflowLog`).
* ``[log] wandb = true`` (:mod:`fedblend.tracking.wandb`) logs to Weights & Biases (``pip install
  'fedblend[wandb]'``), offline by default (files in ``OUT/wandb``; ``wandb sync OUT/wandb/offline-run-*``
  uploads them later), with the resolved config.

Every tracker is :class:`Guarded` (:mod:`fedblend.tracking.base`): a failure -- to start (an unusable store, an
unwritable folder, a server that does not answer) or to log -- is one :class:`TrackerError` line naming it, its
store and the fix, or, with ``[log] on_error = "warn"``, one warning after which the run goes on without it
(:func:`make_trackers`, :mod:`fedblend.tracking.make`).

Every tracker logs the numbers of each row as ``metrics.csv`` has them (:func:`scalar_row`), at step = round.
``fedblend export {tensorboard,mlflow,wandb} RUN_DIR`` writes the same from a finished run's ``metrics.jsonl``,
replacing what an earlier export (or the live log) wrote there, so exporting twice gives the same records.
"""

from __future__ import annotations

from fedblend.tracking.base import Guarded, Tracker, TrackerError, scalar_row
from fedblend.tracking.make import check_available, export_run, make_trackers
from fedblend.tracking.mlflow import (
    MLFLOW_HTTP,
    PROBE_SECONDS,
    RUN_ID,
    MLflowLog,
    allow_file_store,
    probe_server,
    read_mlflow,
)
from fedblend.tracking.tensorboard import TB_DIR, TensorBoardLog, export_tensorboard, read_tensorboard
from fedblend.tracking.wandb import WANDB_BLOCK, WANDB_HEADER, WandbLog, read_wandb_offline, wandb_records

__all__ = ["MLFLOW_HTTP", "PROBE_SECONDS", "RUN_ID", "TB_DIR", "WANDB_BLOCK", "WANDB_HEADER", "Guarded",
           "MLflowLog", "TensorBoardLog", "Tracker", "TrackerError", "WandbLog", "allow_file_store",
           "check_available", "export_run", "export_tensorboard", "make_trackers", "probe_server", "read_mlflow",
           "read_tensorboard", "read_wandb_offline", "scalar_row", "wandb_records"]
