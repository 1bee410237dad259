"""Trackers behind one interface (``fedblend.tracking``): MLflow (a local file store, no server) and W&B (offline)
hold every metrics row, read back with their own readers (MLflow's client; W&B's record schema); a resumed run
continues the same MLflow run; exporting a finished run twice replaces, not doubles; a missing package fails
before the run starts. Skipped with a reason where a package is not installed."""

from __future__ import annotations

import json
import sys
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
    run_experiment(load_config(None, [*TINY, "log.mlflow=true"]), run)
    rid = (run / ".mlflow_run").read_text().strip()
    _assert_holds_every_row(read_mlflow(_mlflow_uri(run), rid), _rows(run))
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
