"""Metrics trackers: a run's metrics rows, as they happen, in the tools people already use.

``[log] tensorboard = true`` writes every metrics row of a run to ``OUT/tensorboard/`` (TensorBoard event
files, through ``torch.utils.tensorboard.SummaryWriter``; needs ``pip install 'fedblend[tensorboard]'``), one
scalar per column of ``metrics.csv`` at step = round; ``fedblend export tensorboard RUN_DIR`` writes the same from
a finished run's ``metrics.jsonl``. Point TensorBoard at the folder: ``tensorboard --logdir runs/``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedblend.common.errors import ConfigError

TB_DIR = "tensorboard"


def scalar_row(m: dict) -> dict[str, float]:
    """The numbers of one metrics row as ``metrics.csv`` has them: every scalar, plus ``num_selected``,
    ``bytes_down_total`` and ``bytes_up_total`` from the per-client lists (non-finite values left out)."""
    out: dict[str, float] = {}
    for k, v in m.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round" and math.isfinite(v):
            out[k] = float(v)
    if isinstance(m.get("selected"), list):
        out["num_selected"] = float(len(m["selected"]))
    for k in ("bytes_down", "bytes_up"):
        if isinstance(m.get(k), list):
            out[f"{k}_total"] = float(sum(m[k]))
    return out


def _summary_writer():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # torch's module needs the tensorboard package
        raise ConfigError("[log] tensorboard = true needs the tensorboard package: pip install "
                          "'fedblend[tensorboard]'") from exc
    return SummaryWriter


class TensorBoardLog:
    """Writes metrics rows to TensorBoard event files under ``log_dir`` as they come."""

    def __init__(self, log_dir: str | Path):
        self.writer = _summary_writer()(log_dir=str(log_dir))

    def __call__(self, m: dict) -> None:
        if "round" not in m or m.get("stopped"):
            return
        for k, v in scalar_row(m).items():
            self.writer.add_scalar(k, v, global_step=int(m["round"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def check_available(cfg_log: Any) -> None:
    """Fail before a run starts when a requested tracker's package is missing."""
    if getattr(cfg_log, "tensorboard", False):
        _summary_writer()


def export_tensorboard(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a run's ``metrics.jsonl`` as TensorBoard event files (default ``RUN_DIR/tensorboard``), replacing the
    event files already in that folder: exporting twice gives the same events, not every point twice."""
    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{run}: no metrics.jsonl (not a run directory)")
    target = Path(out) if out else run / TB_DIR
    # idempotent: the event files already there hold the same rows (an earlier export, or the run's own live log,
    # whose resumed runs repeat rounds); they are replaced, so every round appears once however often this runs
    for old in target.glob("events.out.tfevents.*") if target.is_dir() else ():
        old.unlink()
    log = TensorBoardLog(target)
    try:
        for line in path.read_text().splitlines():
            if line.strip():
                log(json.loads(line))
    finally:
        log.close()
    return target


def read_tensorboard(log_dir: str | Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` of every scalar in the event files under ``log_dir`` (TensorBoard's reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, dict[int, float]] = {}
    for events in sorted(Path(log_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, {}).update({e.step: e.value for e in acc.Scalars(tag)})
    return out
