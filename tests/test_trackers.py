"""Trackers behind one interface (``fedblend.tracking``): MLflow (a local file store, no server) and W&B (offline)
hold every metrics row, read back with their own readers (MLflow's client; W&B's record schema); a resumed run
continues the same MLflow run; exporting a finished run twice replaces, not doubles; a missing package fails
before the run starts. Skipped with a reason where a package is not installed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from fedblend.config import load_config
from fedblend.experiment import run_experiment
from fedblend.tracking import scalar_row

pytestmark = pytest.mark.usefixtures("one_thread")
TINY = ["dataset='synthetic'", "model='mlp'", "rounds=3", "partition.num_clients=4", "partition.min_samples=5",
        "train.lr=0.05", "log.plot=false", "checkpoint_every=1"]


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _assert_holds_every_row(got: dict[str, dict[int, float]], rows: list[dict]) -> None:
    assert rows
    for m in rows:
        for k, v in scalar_row(m).items():
            assert got[k][m["round"]] == pytest.approx(v, rel=1e-6), (k, m["round"])
    assert set(got["acc"]) == {m["round"] for m in rows}


def _mlflow_uri(run: Path) -> str:
    return (run / "mlruns").resolve().as_uri()


def test_mlflow_local_store_holds_every_metrics_row_and_a_resumed_run_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'fedblend[mlflow]')")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    from fedblend.tracking import read_mlflow

    run = tmp_path / "run"
    before = time.time() * 1000
    run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run)
    after = time.time() * 1000
    rid = (run / ".mlflow_run").read_text().strip()
    _assert_holds_every_row(read_mlflow(_mlflow_uri(run), rid), _rows(run))
    stamps = [m.timestamp for key in ("acc", "best_accuracy")
              for m in MlflowClient(_mlflow_uri(run)).get_metric_history(rid, key)]
    assert stamps and all(before <= t <= after for t in stamps)  # when logged (MLflow's wall-time axis), not 1970
    info = MlflowClient(_mlflow_uri(run)).get_run(rid)
    assert info.data.params["method"] == "fedavg" and info.data.params["partition.num_clients"] == "4"
    assert info.data.tags["fedblend.config_hash"] == json.loads((run / "summary.json").read_text())["config_hash"]
    run_experiment(load_config(None, [*TINY, "log.mlflow=true", "rounds=5"]), run, resume=True)
    assert (run / ".mlflow_run").read_text().strip() == rid  # the same MLflow run goes on
    _assert_holds_every_row(read_mlflow(_mlflow_uri(run), rid), _rows(run))


def test_wandb_offline_run_holds_every_metrics_row(tmp_path):
    pytest.importorskip("wandb", reason="W&B not installed (pip install 'fedblend[wandb]')")
    from fedblend.tracking import read_wandb_offline

    run = tmp_path / "run"
    run_experiment(load_config(None, [*TINY, "log.wandb=true"]), run)
    assert list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    _assert_holds_every_row(read_wandb_offline(run / "wandb"), _rows(run))


def test_exporting_twice_replaces_the_earlier_export(tmp_path, monkeypatch, capsys):
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'fedblend[mlflow]')")
    pytest.importorskip("wandb", reason="W&B not installed (pip install 'fedblend[wandb]')")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    from fedblend.cli.main import main
    from fedblend.tracking import read_mlflow, read_wandb_offline

    run = tmp_path / "run"
    run_experiment(load_config(None, TINY), run)
    for _ in range(2):
        assert main(["export", "mlflow", str(run)]) == 0 and main(["export", "wandb", str(run)]) == 0
    rid = (run / ".mlflow_run").read_text().strip()
    client = MlflowClient(_mlflow_uri(run))
    live = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
    assert [r.info.run_id for r in live] == [rid]  # the first export's run was replaced
    assert len(client.get_metric_history(rid, "acc")) == 3
    _assert_holds_every_row(read_mlflow(_mlflow_uri(run), rid), _rows(run))
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    _assert_holds_every_row(read_wandb_offline(run / "wandb"), _rows(run))


@pytest.mark.parametrize("tracker,extra", [("mlflow", "mlflow"), ("wandb", "wandb")])
def test_a_missing_tracker_package_fails_before_the_run(tracker, extra, tmp_path, monkeypatch):
    from fedblend.common.errors import ConfigError

    monkeypatch.setitem(sys.modules, tracker, None)  # import fails
    with pytest.raises(ConfigError, match=rf"pip install 'fedblend\[{extra}\]'"):
        run_experiment(load_config(None, [*TINY, f"log.{tracker}=true"]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_wandb_record_reader_follows_records_across_blocks():
    """W&B's log framing: a record longer than a block is split first / middle / last; a block's tail shorter
    than a header is padding."""
    import struct

    from fedblend.tracking import WANDB_BLOCK, WANDB_HEADER, wandb_records

    def rec(kind: int, data: bytes) -> bytes:
        return struct.pack("<IHB", 0, len(data), kind) + data

    small = b"a" * 10
    blob = WANDB_HEADER + rec(1, small)
    first = WANDB_BLOCK - len(blob) - 7
    big = bytes(range(256)) * 300  # 76,800 bytes: three blocks
    blob += rec(2, big[:first])
    mid = WANDB_BLOCK - 7
    blob += rec(3, big[first:first + mid])
    blob += rec(4, big[first + mid:])
    pad = WANDB_BLOCK - len(blob) % WANDB_BLOCK
    blob += b"\0" * (pad if pad < 7 else 0)
    blob += rec(1, b"tail")
    assert wandb_records(blob) == [small, big, b"tail"]


# ------------------------------------------------------------------------------------------ MLflow (issue #50)
def _mlflow_client(run: Path):
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'fedblend[mlflow]')")
    from mlflow.tracking import MlflowClient

    return MlflowClient(_mlflow_uri(run)), (run / ".mlflow_run").read_text().strip()


@pytest.fixture
def file_store(monkeypatch):
    pytest.importorskip("mlflow", reason="MLflow not installed (pip install 'fedblend[mlflow]')")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


class TestMlflowReadBack:
    def test_read_mlflow_reads_the_local_store_without_the_variable_set(self, tmp_path, file_store):
        """A fresh process with no MLFLOW_ALLOW_FILE_STORE (a user's shell) reads the run back with fedblend's
        reader; MLflow's own client needs the variable (as docs/workflow.md says)."""
        import subprocess

        run = tmp_path / "run"
        run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run)
        rid = (run / ".mlflow_run").read_text().strip()
        env = {k: v for k, v in __import__("os").environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"}
        code = ("import json, sys; from fedblend.tracking import read_mlflow; "
                "print(json.dumps(read_mlflow(sys.argv[1], sys.argv[2])['acc']))")
        out = subprocess.run([sys.executable, "-c", code, _mlflow_uri(run), rid], env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert {int(k): v for k, v in json.loads(out.stdout).items()} == {m["round"]: m["acc"] for m in _rows(run)}
        bare = "from mlflow.tracking import MlflowClient; import sys; MlflowClient(sys.argv[1]).get_run(sys.argv[2])"
        res = subprocess.run([sys.executable, "-c", bare, _mlflow_uri(run), rid], env=env, capture_output=True,
                             text=True, timeout=300)
        documented = subprocess.run([sys.executable, "-c", bare, _mlflow_uri(run), rid], capture_output=True,
                                    text=True, timeout=300, env={**env, "MLFLOW_ALLOW_FILE_STORE": "true"})
        assert documented.returncode == 0, documented.stderr[-2000:]
        if res.returncode == 0:  # an MLflow that still allows its file store by default
            pytest.skip("this MLflow reads a file store without MLFLOW_ALLOW_FILE_STORE")
        assert "MLFLOW_ALLOW_FILE_STORE" in res.stderr


class TestMlflowLogsTheSummaryAndFiles:
    def test_best_and_final_accuracy_status_and_files(self, tmp_path, file_store):
        run = tmp_path / "run"
        run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run)
        client, rid = _mlflow_client(run)
        summary = json.loads((run / "summary.json").read_text())
        got = client.get_run(rid)
        assert got.data.metrics["best_accuracy"] == pytest.approx(summary["best_accuracy"], rel=1e-9)
        assert got.data.metrics["final_accuracy"] == pytest.approx(summary["final_accuracy"], rel=1e-9)
        assert got.data.tags["fedblend.status"] == "finished" and got.info.status == "FINISHED"
        assert {a.path for a in client.list_artifacts(rid)} == {"summary.json", "config.toml"}
        local = Path(client.download_artifacts(rid, "summary.json", str(tmp_path / "dl")))
        assert json.loads(local.read_text()) == summary

    def test_a_stopped_run_is_killed_and_logs_no_summary(self, tmp_path, file_store):
        run = tmp_path / "run"
        run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run, stop_after=2)
        client, rid = _mlflow_client(run)
        got = client.get_run(rid)
        assert got.info.status == "KILLED" and "best_accuracy" not in got.data.metrics
        assert "fedblend.status" not in got.data.tags


class TestMlflowResume:
    def test_a_killed_and_resumed_run_logs_each_round_once(self, tmp_path, file_store):
        """Killed after round 3 with its checkpoint at round 2: the resume redoes round 3; MLflow holds one point
        per round, equal to metrics.jsonl's (the redone round's results are the same; its timings are those of
        the first attempt, which MLflow logged)."""
        cfg = [*TINY, "log.mlflow=true", "rounds=4", "checkpoint_every=2"]
        run = tmp_path / "run"
        run_experiment(load_config(None, cfg), run, stop_after=3)
        run_experiment(load_config(None, cfg), run, resume=True)
        client, rid = _mlflow_client(run)
        steps = [h.step for h in client.get_metric_history(rid, "acc")]
        assert sorted(steps) == [1, 2, 3, 4]
        from fedblend.tracking import read_mlflow

        got = read_mlflow(_mlflow_uri(run), rid)
        for m in _rows(run):
            for k, v in scalar_row(m).items():
                if "seconds" not in k and not k.endswith("_share"):
                    assert got[k][m["round"]] == pytest.approx(v, rel=1e-6), (k, m["round"])
        assert client.get_run(rid).info.status == "FINISHED"


class TestMlflowStoreProblems:
    def test_an_unreachable_server_fails_in_one_line_within_seconds(self, tmp_path, file_store):
        """A port that accepts connections and never answers (a hung server): no hang, one line naming the
        store and the fix, nothing of the run left behind."""
        import socket
        import time

        from fedblend.tracking import TrackerError

        with socket.socket() as srv:
            srv.bind(("127.0.0.1", 0))
            srv.listen(8)
            uri = f"http://127.0.0.1:{srv.getsockname()[1]}"
            t0 = time.monotonic()
            with pytest.raises(TrackerError) as err:
                run_experiment(load_config(None, [*TINY, "rounds=2", "log.mlflow=true", f"log.mlflow_uri={uri!r}"]),
                               tmp_path / "run")
            assert time.monotonic() - t0 < 60
        msg = str(err.value)
        assert uri in msg and "does not answer" in msg and "on_error" in msg and "\n" not in msg
        assert not (tmp_path / "run").exists()

    def test_on_error_warn_runs_without_the_tracker(self, tmp_path, file_store):
        uri = "http://127.0.0.1:9"  # the discard port: nothing listens
        with pytest.warns(RuntimeWarning, match="goes on without it"):
            s = run_experiment(load_config(None, [*TINY, "rounds=2", "log.mlflow=true", f"log.mlflow_uri={uri!r}",
                                                  "log.on_error='warn'"]), tmp_path / "run")
        assert s["status"] == "finished" and s["rounds"] == 2 and not (tmp_path / "run" / ".mlflow_run").exists()

    def test_on_error_takes_stop_or_warn_only(self, tmp_path):
        from fedblend.common.errors import ConfigError

        with pytest.raises(ConfigError, match="on_error"):
            load_config(None, [*TINY, "log.on_error='ignore'"])

    def test_an_unusable_store_is_one_line_naming_it(self, tmp_path, file_store):
        from fedblend.tracking import TrackerError

        uri = "file:///proc/mlruns"
        with pytest.raises(TrackerError, match=r"MLflow store file:///proc/mlruns cannot be used") as err:
            run_experiment(load_config(None, [*TINY, "log.mlflow=true", f"log.mlflow_uri={uri!r}"]), tmp_path / "run")
        assert "\n" not in str(err.value)

    def test_a_tracker_failing_mid_run_is_named_with_its_round(self, tmp_path):
        from fedblend.tracking import Guarded, TrackerError

        class Broken:
            def __call__(self, m):
                raise ConnectionError("server went away")

            def close(self):
                pass

        g = Guarded(Broken(), "mlflow", "http://x", "stop")
        with pytest.raises(TrackerError, match=r"mlflow tracker \(http://x\) failed logging round 2: ConnectionError"):
            g({"round": 2})
        w = Guarded(Broken(), "mlflow", "http://x", "warn")
        with pytest.warns(RuntimeWarning, match="goes on without it"):
            w({"round": 2})
        w({"round": 3})  # left out: no second warning, no error


class TestMlflowRunFile:
    def _finished(self, tmp_path) -> Path:
        run = tmp_path / "run"
        run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run)
        return run

    @pytest.mark.parametrize("text", ["", "not-an-id", "0" * 31, "g" * 32])
    def test_a_damaged_run_file_is_named_on_resume(self, tmp_path, file_store, text):
        from fedblend.tracking import TrackerError

        run = self._finished(tmp_path)
        (run / ".mlflow_run").write_text(text)
        with pytest.raises(TrackerError, match=r"\.mlflow_run is damaged.*delete .*\.mlflow_run"):
            run_experiment(load_config(None, [*TINY, "log.mlflow=true", "rounds=4"]), run, resume=True)

    def test_a_run_id_the_store_does_not_hold_is_named(self, tmp_path, file_store):
        from fedblend.tracking import TrackerError

        run = self._finished(tmp_path)
        (run / ".mlflow_run").write_text("0123456789abcdef0123456789abcdef\n")
        with pytest.raises(TrackerError, match="which the store .* does not hold"):
            run_experiment(load_config(None, [*TINY, "log.mlflow=true", "rounds=4"]), run, resume=True)

    def test_a_run_id_of_another_run_is_named(self, tmp_path, file_store):
        from fedblend.tracking import TrackerError

        run, other = self._finished(tmp_path), tmp_path / "other"
        run_experiment(load_config(None, [*TINY, "log.mlflow=true", "seed=7", "log.mlflow_uri="
                                          f"{_mlflow_uri(run)!r}"]), other)
        (run / ".mlflow_run").write_text((other / ".mlflow_run").read_text())
        with pytest.raises(TrackerError, match=r"logged another run \(method 'fedavg', seed '7'"):
            run_experiment(load_config(None, [*TINY, "log.mlflow=true", "rounds=4"]), run, resume=True)


# ------------------------------------------------------------------ MLflow's own web UI, as docs/workflow.md says
def _ui_python() -> str:
    """An interpreter whose MLflow has its web UI: ``FEDBLEND_MLFLOW_UI_PYTHON`` (e.g. a venv with the full
    ``mlflow`` package), else this one when it has ``flask`` (the ``mlflow`` extra installs mlflow-skinny, which
    has no UI: skipped then)."""
    import importlib.util
    import os

    given = os.environ.get("FEDBLEND_MLFLOW_UI_PYTHON")
    if given:
        return given
    if importlib.util.find_spec("flask") is None:
        pytest.skip("MLflow's web UI needs the full mlflow package (flask); set FEDBLEND_MLFLOW_UI_PYTHON to a "
                    "Python that has it")
    return sys.executable


def _http(url: str, body: dict | None = None) -> tuple[int, bytes]:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, whatever the proxy variables
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with opener.open(req, timeout=10) as r:
        return r.status, r.read()


def test_the_documented_mlflow_ui_serves_the_summary_status_and_files(tmp_path, file_store):
    import os
    import signal
    import socket
    import subprocess
    import time
    import urllib.error

    ui = _ui_python()
    run = tmp_path / "run"
    run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run)
    summary, rid = json.loads((run / "summary.json").read_text()), (run / ".mlflow_run").read_text().strip()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the command of docs/workflow.md: MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri OUT/mlruns
    server = subprocess.Popen([ui, "-m", "mlflow", "ui", "--backend-store-uri", str(run / "mlruns"),
                               "--host", "127.0.0.1", "--port", str(port)], cwd=tmp_path, start_new_session=True,
                              env={**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(180):
            if server.poll() is not None:
                pytest.fail(f"mlflow ui exited {server.returncode}: {server.stderr.read().decode()[-2000:]}")
            try:
                if _http(base + "/")[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        else:
            pytest.fail("mlflow ui did not answer within 90 s")
        got = json.loads(_http(base + "/api/2.0/mlflow/runs/get?run_id=" + rid)[1])["run"]
        metrics = {m["key"]: m["value"] for m in got["data"]["metrics"]}
        tags = {t["key"]: t["value"] for t in got["data"]["tags"]}
        assert metrics["best_accuracy"] == pytest.approx(summary["best_accuracy"], rel=1e-9)
        assert metrics["final_accuracy"] == pytest.approx(summary["final_accuracy"], rel=1e-9)
        assert tags["fedblend.status"] == "finished" and got["info"]["status"] == "FINISHED"
        files = json.loads(_http(base + "/api/2.0/mlflow/artifacts/list?run_id=" + rid)[1])["files"]
        assert {f["path"] for f in files} == {"summary.json", "config.toml"}
        history = json.loads(_http(base + f"/api/2.0/mlflow/metrics/get-history?run_id={rid}&metric_key=acc")[1])
        assert {int(m["step"]): m["value"] for m in history["metrics"]} == {m["round"]: m["acc"] for m in _rows(run)}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
