"""TensorBoard: ``[log] tensorboard = true`` writes every metrics row of a run to ``OUT/tensorboard/`` (event files,
through ``torch.utils.tensorboard.SummaryWriter``; ``pip install 'fedblend[tensorboard]'``); ``fedblend export
tensorboard RUN_DIR`` writes a finished run's rows there; :func:`read_tensorboard` reads them back."""

from __future__ import annotations

from pathlib import Path

from fedblend.common.errors import UserFileError
from fedblend.common.jsonio import read_jsonl
from fedblend.common.optional import require
from fedblend.tracking.base import loggable, scalar_row

TB_DIR = "tensorboard"


def summary_writer():
    """torch's ``SummaryWriter`` class (a ConfigError naming the extra to install when tensorboard is missing)."""
    require("tensorboard", "tensorboard", "[log] tensorboard = true")  # torch's writer needs this package
    return require("torch.utils.tensorboard", "tensorboard", "[log] tensorboard = true").SummaryWriter


class TensorBoardLog:
    """Writes metrics rows to TensorBoard event files under ``log_dir`` as they come."""

    def __init__(self, log_dir: str | Path, writer_cls=None):
        self.writer = (writer_cls or summary_writer())(log_dir=str(log_dir))

    def __call__(self, m: dict) -> None:
        if not loggable(m):
            return
        for k, v in scalar_row(m).items():
            self.writer.add_scalar(k, v, global_step=int(m["round"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def export_tensorboard(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write a run's ``metrics.jsonl`` as TensorBoard event files (default ``RUN_DIR/tensorboard``), replacing
    the event files an earlier export (or the run's ``[log] tensorboard``) left there, so no row appears twice.
    Holds the writer lock of the run directory (default target) or of ``out`` while it writes."""
    from fedblend.rundir import DirLock

    run = Path(run_dir)
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise UserFileError(f"{run}: no metrics.jsonl (not a run directory); give the directory of a run")
    target = Path(out) if out else run / TB_DIR
    writer = summary_writer()  # the package is there, before anything is written
    with DirLock(run if not out else target, "run directory" if not out else "TensorBoard folder"):
        rows = read_jsonl(path, f"continue the run (fedblend run {run / 'config.toml'} --out {run} --resume rewrites "
                                f"metrics.jsonl from its checkpoint), or delete the damaged line")
        if target.is_dir():
            for old in target.glob("events.out.tfevents.*"):
                old.unlink()
        log = TensorBoardLog(target, writer)
        try:
            for row in rows:
                log(row)
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
