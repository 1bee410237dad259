"""Metrics trackers: a run's metrics rows, as they happen, in the tools people already use.

One small interface (:class:`Tracker`: called with every metrics row, then closed), three trackers, each an
optional extra that is checked before a run starts:

* ``[log] tensorboard = true`` writes every metrics row of a run to ``OUT/tensorboard/`` (TensorBoard event
  files, through ``torch.utils.tensorboard.SummaryWriter``; ``pip install 'fedblend[tensorboard]'``). Point
  TensorBoard at the folder: ``tensorboard --logdir runs/``.
* ``[log] mlflow = true`` logs to MLflow (``pip install 'fedblend[mlflow]'``: mlflow-skinny, no web UI): by
  default a local file store in ``OUT/mlruns`` (no server; MLflow 3 reads it only with
  ``MLFLOW_ALLOW_FILE_STORE=true``, docs/workflow.md), or ``[log] mlflow_uri`` (a ``sqlite:///...`` file, a
  server, probed before round 1). The run is named by the config's label and seed, its parameters are the
  resolved config's fields (dotted), its tags the config hash and method; at the end the summary's numbers, its
  status and the run's files (:class:`MLflowLog`).

Every tracker is :class:`Guarded`: a failure is one :class:`TrackerError` line naming it and its store, or, with
``[log] on_error = "warn"``, one warning after which the run goes on without it.
* ``[log] wandb = true`` logs to Weights & Biases (``pip install 'fedblend[wandb]'``), offline by default (files
  in ``OUT/wandb``; ``wandb sync OUT/wandb/offline-run-*`` uploads them later), with the resolved config.

Every tracker logs the numbers of each row as ``metrics.csv`` has them (:func:`scalar_row`), at step = round.
``fedblend export {tensorboard,mlflow,wandb} RUN_DIR`` writes the same from a finished run's ``metrics.jsonl``,
replacing what an earlier export (or the live log) wrote there, so exporting twice gives the same records.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

from fedblend.common.errors import ConfigError, FedblendError, UserFileError
from fedblend.common.jsonio import dotted_keys, read_json_object, read_jsonl
from fedblend.common.optional import require

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
    require("tensorboard", "tensorboard", "[log] tensorboard = true")  # torch's writer needs this package
    return require("torch.utils.tensorboard", "tensorboard", "[log] tensorboard = true").SummaryWriter


class Tracker(Protocol):
    """A destination for a run's metrics rows: called with each row (a dict as in ``metrics.jsonl``) as the run
    writes it, then closed once."""

    def __call__(self, m: dict) -> None: ...

    def close(self) -> None: ...


def _loggable(m: dict) -> bool:
    return "round" in m and not m.get("stopped")


class TensorBoardLog:
    """Writes metrics rows to TensorBoard event files under ``log_dir`` as they come."""

    def __init__(self, log_dir: str | Path, writer_cls=None):
        self.writer = (writer_cls or _summary_writer())(log_dir=str(log_dir))

    def __call__(self, m: dict) -> None:
        if not _loggable(m):
            return
        for k, v in scalar_row(m).items():
            self.writer.add_scalar(k, v, global_step=int(m["round"]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _mlflow():
    require("mlflow", "mlflow", "[log] mlflow = true")
    return require("mlflow.tracking", "mlflow", "[log] mlflow = true").MlflowClient


class TrackerError(FedblendError):
    """A tracker cannot log (its store unusable, its server unreachable, its run file damaged): the message names
    the tracker, the store and the fix (``[log] on_error = "warn"`` goes on without the tracker)."""


#: how long an MLflow server may take to answer, and how often a request is tried again (MLflow's own defaults,
#: 120 s and 7 tries with backoff, make an unreachable server hang a run for many minutes); the environment
#: variables of the same names, when set, win
MLFLOW_HTTP = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "20", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1"}
PROBE_SECONDS = 10.0
RUN_ID = re.compile(r"[0-9a-f]{32}")


def allow_file_store(uri: str) -> None:
    """MLflow 3 refuses its plain-file store (a ``file:`` URI or a path: what ``[log] mlflow`` writes by default,
    ``OUT/mlruns``) unless ``MLFLOW_ALLOW_FILE_STORE=true``; set it in this process for such a URI (a user's own
    MLflow commands need it too: docs/workflow.md)."""
    if "://" not in uri or uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


def probe_server(uri: str, timeout: float = PROBE_SECONDS) -> None:
    """For an ``http(s)://`` tracking URI, check that the server answers an HTTP request (its ``/health``; any
    HTTP answer counts) within ``timeout`` seconds; raises :class:`TrackerError` naming the store and the fix
    otherwise -- a server that is down, an address that drops packets, a port that accepts and never answers.
    Other stores are checked by using them."""
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout):  # noqa: S310 - the user's URI
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise TrackerError(f"MLflow server {uri} does not answer ({why}; waited at most {timeout:g} s): start it, "
                           f"fix [log] mlflow_uri, set [log] mlflow = false, or [log] on_error = \"warn\" to run "
                           f"without it") from None


def _store_error(uri: str, exc: BaseException) -> TrackerError:
    text = " ".join(str(exc).split())[:300]
    return TrackerError(f"MLflow store {uri} cannot be used ({type(exc).__name__}: {text}): fix [log] mlflow_uri "
                        f"(empty = a local store in OUT/mlruns), set [log] mlflow = false, or [log] on_error = "
                        f"\"warn\" to run without it")


class MLflowLog:
    """Logs metrics rows to an MLflow run (one per results directory: its id is kept in ``OUT/.mlflow_run``, so a
    resumed run continues the same MLflow run). ``uri`` empty: a local file store in ``out/mlruns``.

    A resumed run redoes the rounds after its checkpoint with the same results; the rows of rounds the MLflow run
    already holds are not logged again (no step twice). At the end it logs the summary (``best_accuracy``,
    ``final_accuracy``, ``best_round`` and the status as a tag ``fedblend.status``) and the run's
    ``summary.json`` and ``config.toml`` as artifacts, and ends the MLflow run as FINISHED (a finished run, also
    one that lost clients), FAILED (diverged) or KILLED (stopped before its summary)."""

    ID_FILE = ".mlflow_run"
    STEP_KEY = "seconds"  # in every metrics row: the last step the MLflow run holds

    def __init__(self, out: str | Path, identity: dict | None = None, uri: str = "", experiment: str = "fedblend",
                 fresh: bool = False):
        client_cls = _mlflow()
        out = Path(out)
        self.out = out
        for k, v in MLFLOW_HTTP.items():
            os.environ.setdefault(k, v)
        if not uri:
            # MLflow 3 keeps its plain-file store only on request; it is what "no server, files in OUT" needs
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (out / "mlruns").resolve().as_uri()
        self.uri = uri
        probe_server(uri)
        import time

        self.started = 0.0 if fresh else time.time()  # a summary.json older than this is not this run's
        try:
            self.client = client_cls(uri)
            exp = self.client.get_experiment_by_name(experiment)
            eid = exp.experiment_id if exp is not None else self.client.create_experiment(experiment)
        except Exception as exc:  # noqa: BLE001 - MLflow's own exceptions: one line naming the store
            raise _store_error(uri, exc) from None
        id_file = out / self.ID_FILE
        if fresh:  # an export replaces the MLflow run an earlier export (or the live log) wrote
            old = id_file.read_text(errors="replace").strip() if id_file.exists() else ""
            if RUN_ID.fullmatch(old):
                try:
                    self.client.delete_run(old)
                except Exception:  # noqa: BLE001 - the old run is gone already (another store): nothing to replace
                    pass
            old = ""
        else:
            old = self._recorded(id_file, identity) if id_file.exists() else ""
        self.logged = 0  # the last round the MLflow run holds
        if old:
            self.run_id = old
            try:
                hist = self.client.get_metric_history(old, self.STEP_KEY)
            except Exception as exc:  # noqa: BLE001
                raise _store_error(uri, exc) from None
            self.logged = max((h.step for h in hist), default=0)
        else:
            self.run_id = self._create(eid, out, identity)
            id_file.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_text(self.run_id + "\n")

    def _create(self, eid: str, out: Path, identity: dict | None) -> str:
        cfg = (identity or {}).get("config") or {}
        name = f"{cfg.get('name') or cfg.get('method', 'run')}-seed{cfg.get('seed', 0)}"
        tags = {"fedblend.config_hash": str((identity or {}).get("config_hash", "")),
                "fedblend.method": str(cfg.get("method", "")), "fedblend.out": str(out.resolve())}
        from mlflow.entities import Param

        try:
            run_id = self.client.create_run(eid, run_name=name, tags=tags).info.run_id
            params = [Param(k[:250], str(v)[:6000]) for k, v in dotted_keys(cfg).items()]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i:i + 100])
        except Exception as exc:  # noqa: BLE001
            raise _store_error(self.uri, exc) from None
        return run_id

    def _recorded(self, id_file: Path, identity: dict | None) -> str:
        """The MLflow run id ``.mlflow_run`` names, checked: an MLflow run id, held by this store, logged by a
        run of this method and seed; else :class:`TrackerError` naming the file and the fix."""
        fix = f"delete {id_file} to start a new MLflow run for this directory"
        text = id_file.read_text(errors="replace").strip()
        if not RUN_ID.fullmatch(text):
            raise TrackerError(f"{id_file} is damaged: it should hold one MLflow run id (32 hex digits), it holds "
                               f"{text[:60]!r}; {fix}")
        try:
            run = self.client.get_run(text)
        except Exception:  # noqa: BLE001 - MLflow says "not found" in its own exception types
            raise TrackerError(f"{id_file} names MLflow run {text}, which the store {self.uri} does not hold (another "
                               f"store, or the run was deleted: is [log] mlflow_uri the one this run logged to?); "
                               f"{fix}") from None
        cfg = (identity or {}).get("config") or {}
        want = {"method": str(cfg.get("method", "")), "seed": str(cfg.get("seed", ""))}
        have = {"method": run.data.tags.get("fedblend.method", ""), "seed": run.data.params.get("seed", "")}
        if cfg and want != have:
            raise TrackerError(f"{id_file} names MLflow run {text}, which logged another run (method "
                               f"{have['method']!r}, seed {have['seed']!r}; this one: {want['method']!r}, "
                               f"{want['seed']!r}); {fix}")
        return text

    def __call__(self, m: dict) -> None:
        if not _loggable(m) or int(m["round"]) <= self.logged:  # a resumed run's redone round: logged already
            return
        from mlflow.entities import Metric

        step = int(m["round"])
        metrics = [Metric(k, v, 0, step) for k, v in scalar_row(m).items()]
        for i in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 500])
        self.logged = step

    def close(self) -> None:
        summary = self._summary()
        status = "KILLED"
        if summary is not None:
            from mlflow.entities import Metric

            step = int(summary.get("rounds") or 0)
            nums = [Metric(k, float(summary[k]), 0, step) for k in ("best_accuracy", "final_accuracy", "best_round")
                    if isinstance(summary.get(k), (int, float)) and not isinstance(summary.get(k), bool)
                    and math.isfinite(summary[k])]
            self.client.log_batch(self.run_id, metrics=nums)
            self.client.set_tag(self.run_id, "fedblend.status", str(summary.get("status", "")))
            for name in ("summary.json", "config.toml"):
                if (self.out / name).is_file():
                    self.client.log_artifact(self.run_id, str(self.out / name))
            status = "FAILED" if summary.get("status") == "diverged" else "FINISHED"
        self.client.set_terminated(self.run_id, status)

    def _summary(self) -> dict | None:
        """This run's summary.json, if it wrote one (an older one, of the run it resumed, does not count)."""
        path = self.out / "summary.json"
        try:
            if path.stat().st_mtime < self.started:
                return None
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None


def read_mlflow(uri: str, run_id: str) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of an MLflow run, through MLflow's own client (a local file store allowed)."""
    allow_file_store(uri)
    client = _mlflow()(uri)
    keys = client.get_run(run_id).data.metrics
    return {k: {h.step: h.value for h in client.get_metric_history(run_id, k)} for k in keys}


def _wandb():
    return require("wandb", "wandb", "[log] wandb = true")


class WandbLog:
    """Logs metrics rows to a W&B run, offline by default (files under ``out/wandb``), with the resolved config."""

    def __init__(self, out: str | Path, identity: dict | None = None, project: str = "fedblend",
                 mode: str = "offline", fresh: bool = False):
        wandb = _wandb()
        out = Path(out)
        target = out / "wandb"
        if fresh:  # an export replaces the runs an earlier export (or the live log) wrote there
            shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        cfg = (identity or {}).get("config") or {}
        name = f"{cfg.get('name') or cfg.get('method', 'run')}-seed{cfg.get('seed', 0)}"
        self.run = wandb.init(project=project, name=name, dir=str(out), mode=mode, config=cfg, reinit="create_new",
                              tags=[str(cfg.get("method", ""))] if cfg.get("method") else None,
                              settings=wandb.Settings(console="off", silent=True, x_disable_stats=True))

    def __call__(self, m: dict) -> None:
        if _loggable(m):
            self.run.log(scalar_row(m), step=int(m["round"]))

    def close(self) -> None:
        self.run.finish()
        _wandb().teardown()  # finish() returns before W&B's service has written the run's files; this waits


def read_wandb_offline(run_dir: str | Path) -> dict[str, dict[int, float]]:
    """``{metric: {step: value}}`` of the offline W&B runs under ``run_dir`` (a results directory, or its
    ``wandb`` folder): the history records of their ``.wandb`` files, decoded with W&B's own record schema
    (``wandb.proto.wandb_internal_pb2.Record``)."""
    from wandb.proto import wandb_internal_pb2

    out: dict[str, dict[int, float]] = {}
    for path in sorted(Path(run_dir).rglob("run-*.wandb")):
        for data in wandb_records(path.read_bytes()):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            if rec.WhichOneof("record_type") != "history":
                continue
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            step = int(items.get("_step", rec.history.step.num))
            for k, v in items.items():
                if not k.startswith("_") and isinstance(v, (int, float)):
                    out.setdefault(k, {})[step] = float(v)
    return out


WANDB_HEADER = b":W&B\xe1\xbe\x00"  # ident, magic 0xBEE1, version 0
WANDB_BLOCK = 32768


def wandb_records(blob: bytes) -> list[bytes]:
    """The records of a ``.wandb`` file: W&B's transaction log (LevelDB's log framing: 32 KiB blocks of records,
    each a 7-byte header -- crc32, length, type full / first / middle / last -- and its data)."""
    import struct

    if not blob.startswith(WANDB_HEADER):
        raise ValueError("not a W&B transaction log (bad header)")
    records, pending, pos = [], b"", len(WANDB_HEADER)
    while pos + 7 <= len(blob):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", blob[pos:pos + 7])
        data = blob[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            pos += WANDB_BLOCK - pos % WANDB_BLOCK if pos % WANDB_BLOCK else 0
            continue
        if kind == 1:
            records.append(data)
        elif kind == 2:
            pending = data
        elif kind == 3:
            pending += data
        elif kind == 4:
            records.append(pending + data)
            pending = b""
    return records


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
                f"{name} tracker ({where}) failed to start: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
            if on_error != "warn":
                raise err from None
            warnings.warn(f"{err}; the run goes on without it ([log] on_error = 'warn')", RuntimeWarning,
                          stacklevel=2)
    return trackers


class Guarded:
    """A tracker whose failures are one line naming it, its store and the round: raised as :class:`TrackerError`
    (``on_error = "stop"``), or warned once, after which the tracker is left out (``"warn"``)."""

    def __init__(self, tracker: Tracker, name: str, where: str, on_error: str = "stop"):
        self.tracker, self.name, self.where, self.on_error, self.off = tracker, name, where, on_error, False

    def _failed(self, what: str, exc: Exception) -> None:
        err = exc if isinstance(exc, TrackerError) else TrackerError(
            f"{self.name} tracker ({self.where}) failed {what}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}; set [log] on_error = \"warn\" to go on without it")
        if self.on_error != "warn":
            raise err from None
        self.off = True
        warnings.warn(f"{err}; the run goes on without it ([log] on_error = 'warn')", RuntimeWarning, stacklevel=3)

    def __call__(self, m: dict) -> None:
        if self.off:
            return
        try:
            self.tracker(m)
        except Exception as exc:  # noqa: BLE001
            self._failed(f"logging round {m.get('round')}", exc)

    def close(self) -> None:
        if self.off:
            return
        try:
            self.tracker.close()
        except Exception as exc:  # noqa: BLE001
            self._failed("at the run's end", exc)

    def __getattr__(self, name: str) -> Any:  # the tracker's own attributes (run_id, uri, ...)
        return getattr(self.tracker, name)


def check_available(cfg_log: Any) -> None:
    """Fail before a run starts when a requested tracker's package is missing."""
    if getattr(cfg_log, "tensorboard", False):
        _summary_writer()
    if getattr(cfg_log, "mlflow", False):
        _mlflow()
    if getattr(cfg_log, "wandb", False):
        _wandb()


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
    writer = _summary_writer()  # the package is there, before anything is written
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
