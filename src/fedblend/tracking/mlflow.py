"""MLflow: ``[log] mlflow = true`` logs a run to MLflow (``pip install 'fedblend[mlflow]'``: mlflow-skinny, no web UI):
by default a local file store in ``OUT/mlruns`` (no server; MLflow 3 reads it only with
``MLFLOW_ALLOW_FILE_STORE=true``, docs/workflow.md), or ``[log] mlflow_uri`` (a ``sqlite:///...`` file, a server,
probed before round 1). The run is named by the config's label and seed, its parameters are the resolved config's
fields (dotted), its tags the config hash and method; at the end the summary's numbers, its status and the run's
files (:class:`MLflowLog`)."""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path

from fedblend.common.jsonio import dotted_keys
from fedblend.common.optional import require
from fedblend.tracking.base import TrackerError, loggable, scalar_row


def mlflow_client():
    """MLflow's ``MlflowClient`` class (a :class:`~fedblend.common.errors.ConfigError` naming the extra to install
    when MLflow is missing)."""
    require("mlflow", "mlflow", "[log] mlflow = true")
    return require("mlflow.tracking", "mlflow", "[log] mlflow = true").MlflowClient


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
        client_cls = mlflow_client()
        out = Path(out)
        self.out = out
        for k, v in MLFLOW_HTTP.items():
            os.environ.setdefault(k, v)
        # MLflow 3 keeps its plain-file store only on request: what "no server, files in OUT" needs (the default),
        # and what an explicit file: URI asks for
        uri = uri or (out / "mlruns").resolve().as_uri()
        allow_file_store(uri)
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
        if not loggable(m) or int(m["round"]) <= self.logged:  # a resumed run's redone round: logged already
            return
        from mlflow.entities import Metric

        step, now = int(m["round"]), _now_ms()
        metrics = [Metric(k, v, now, step) for k, v in scalar_row(m).items()]
        for i in range(0, len(metrics), 500):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 500])
        self.logged = step

    def close(self) -> None:
        summary = self._summary()
        status = "KILLED"
        if summary is not None:
            from mlflow.entities import Metric

            step, now = int(summary.get("rounds") or 0), _now_ms()
            nums = [Metric(k, float(summary[k]), now, step) for k in ("best_accuracy", "final_accuracy", "best_round")
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
    client = mlflow_client()(uri)
    keys = client.get_run(run_id).data.metrics
    return {k: {h.step: h.value for h in client.get_metric_history(run_id, k)} for k in keys}


def _now_ms() -> int:
    """A metric's MLflow timestamp: when it was logged, in milliseconds (what ``mlflow.log_metric`` records; 0 put
    every point at 1970 on MLflow's wall-time axis)."""
    return int(time.time() * 1000)
