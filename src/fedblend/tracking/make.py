"""The trackers of a run (:func:`make_trackers`, checked before it starts by :func:`check_available`) and
``fedblend export`` (:func:`export_run`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from fedblend.common.errors import ConfigError, UserFileError
from fedblend.common.jsonio import read_json_object, read_jsonl
from fedblend.tracking.base import Guarded, Tracker, TrackerError
from fedblend.tracking.mlflow import MLflowLog, mlflow_client
from fedblend.tracking.tensorboard import TB_DIR, TensorBoardLog, export_tensorboard, summary_writer
from fedblend.tracking.wandb import WandbLog, wandb_module

#: what to change when a tracker cannot start (besides turning it off or ``on_error = "warn"``)
START_FIX = {"tensorboard": "make the folder writable (or --out another directory)",
             "mlflow": "fix [log] mlflow_uri (empty = a local store in OUT/mlruns)",
             "wandb": "check [log] wandb_mode and wandb_project (offline needs no account)"}


def make_trackers(cfg_log: Any, out: str | Path, identity: dict | None = None) -> list[Tracker]:
    """The trackers a run's ``[log]`` table asks for, writing into the results directory ``out``, each
    :class:`Guarded` by ``[log] on_error``: a tracker that fails stops the run in one line naming it
    (``"stop"``) or is warned about once and left out for the rest of the run (``"warn"``)."""
    out = Path(out)
    on_error = getattr(cfg_log, "on_error", "stop")
    makers = []
    if getattr(cfg_log, "tensorboard", False):
        makers.append(("tensorboard", str(out / TB_DIR), lambda: TensorBoardLog(out / TB_DIR)))
    if getattr(cfg_log, "mlflow", False):
        makers.append(("mlflow", cfg_log.mlflow_uri or str(out / "mlruns"),
                       lambda: MLflowLog(out, identity, cfg_log.mlflow_uri, cfg_log.mlflow_experiment)))
    if getattr(cfg_log, "wandb", False):
        makers.append(("wandb", str(out / "wandb"),
                       lambda: WandbLog(out, identity, cfg_log.wandb_project, cfg_log.wandb_mode)))
    trackers: list[Tracker] = []
    for name, where, make in makers:
        try:
            trackers.append(Guarded(make(), name, where, on_error))
        except Exception as exc:  # noqa: BLE001 - any tracker's failure to start, named
            err = exc if isinstance(exc, TrackerError) else TrackerError(
                f"{name} tracker ({where}) failed to start: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}; "
                f"{START_FIX[name]}, set [log] {name} = false, or [log] on_error = \"warn\" to run without it")
            if on_error != "warn":
                raise err from None
            warnings.warn(f"{err}; the run goes on without it ([log] on_error = 'warn')", RuntimeWarning,
                          stacklevel=2)
    return trackers


def check_available(cfg_log: Any) -> None:
    """Fail before a run starts when a requested tracker's package is missing."""
    if getattr(cfg_log, "tensorboard", False):
        summary_writer()
    if getattr(cfg_log, "mlflow", False):
        mlflow_client()
    if getattr(cfg_log, "wandb", False):
        wandb_module()


def export_run(fmt: str, run_dir: str | Path, out: str | Path | None = None) -> str:
    """``fedblend export FORMAT RUN_DIR``: a finished run's metrics.jsonl into ``tensorboard`` (event files in
    ``out``, default ``RUN_DIR/tensorboard``), ``mlflow`` (the local store ``out``, default ``RUN_DIR/mlruns``) or
    ``wandb`` (an offline run under ``out``, default ``RUN_DIR``), replacing an earlier export there; returns
    where it wrote."""
    run = Path(run_dir)
    rows = _rows(run)
    if fmt == "tensorboard":
        return str(export_tensorboard(run, out))
    identity = {}
    if (run / "summary.json").exists():
        s = read_json_object(run / "summary.json", "the run's summary.json is written at its end: finish the run")
        identity = {"config": (s.get("run") or {}).get("config") or {}, "config_hash": s.get("config_hash")}
    if fmt == "mlflow":
        base = Path(out) if out else run
        tr: Tracker = MLflowLog(base, identity, "" if out is None else (base / "mlruns").resolve().as_uri(),
                                fresh=True)
        where = f"{tr.uri} (run {tr.run_id})"
    elif fmt == "wandb":
        base = Path(out) if out else run
        tr = WandbLog(base, identity, fresh=True)
        where = str(base / "wandb")
    else:
        raise ConfigError(f"export: unknown format {fmt!r}; known: tensorboard, mlflow, wandb")
    try:
        for m in rows:
            tr(m)
    finally:
        tr.close()
    return where


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        raise UserFileError(f"{run}: no metrics.jsonl (not a run directory); give the directory of a run")
    return read_jsonl(path, f"continue the run (fedblend run {run / 'config.toml'} --out {run} --resume rewrites "
                            f"metrics.jsonl from its checkpoint), or delete the damaged line")
