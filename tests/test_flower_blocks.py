"""fedblend.flower.blocks: examples/flower-app (a Flower app whose ServerApp / ClientApp are
``fedblend.flower.server_app(config)`` / ``client_app(config)``) submitted with ``flwr run`` to a real SuperLink
and 2 SuperNodes on loopback: the per-round scores equal ``fedblend run``'s of the same config, bit for bit.

FedAvg always runs; FedALA, FedAPA and pFedRLLA are marked ``slow`` (``pytest --slow``). Measured on 2 cores shared
with other runs (load ~5): FedAvg 102 s of ``flwr run`` (the file 116 s), FedALA 124 s, FedAPA 128 s, pFedRLLA
172 s. The time is Flower's process model: a fresh ClientApp process (importing torch, Flower, fedblend) per node
and message, 5 exchanges for 2 rounds.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[flower]')")

from fedblend.cli.main import main  # noqa: E402
from fedblend.config import load_config  # noqa: E402
from fedblend.flower import blocks  # noqa: E402
from tests.helpers import history  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "flower-app"
CONFIG = EXAMPLE / "fedblend_app" / "fedblend.toml"
SCORES = ("acc", "loss", "train_loss", "global_acc", "bytes_down", "bytes_up", "selected")


def test_run_config_overrides():
    """The app's run config: ``fedblend.*`` keys override config fields, deployment options override the
    factory's; the result is the run config of the generated app."""
    raw = blocks.raw_config(CONFIG, ["seed=4"])
    rc = blocks.run_config_for(raw, {"fedblend.method": "fedala", "fedblend.train.lr": 0.1, "num-nodes": 3,
                                     "unrelated": 1}, {"num-nodes": 2, "threads": 1})
    cfg = json.loads(rc["fedblend-config"])
    assert (cfg["method"], cfg["seed"], cfg["train"]["lr"], cfg["dataset"]) == ("fedala", 4, 0.1, "synthetic")
    assert rc["num-nodes"] == 3 and rc["out"].endswith("synthetic-dirichlet-fedala") and "unrelated" not in rc
    assert cfg == load_config(CONFIG, ["seed=4", "method='fedala'", "train.lr=0.1"]).resolved()


@pytest.mark.parametrize("method", ["fedavg", *(pytest.param(m, marks=pytest.mark.slow)
                                                for m in ("fedala", "fedapa", "pfedrlla"))])
def test_example_app_equals_fedblend_run(method, tmp_path, flwr_bin, monkeypatch):
    from fedblend.flower.deploy import CONNECTION, local_federation

    from .test_flower import _children

    sets = [f"method={method!r}", "rounds=2"]
    assert main(["run", str(CONFIG), *[f"--set={s}" for s in sets], "--out", str(tmp_path / "sim"), "--threads", "1",
                 "--quiet"]) == 0
    out = tmp_path / "flw"
    t0 = time.monotonic()
    with local_federation(tmp_path / "fed") as fed:
        fed.start_superlink()
        for k in range(2):
            fed.start_supernode(k, f'partition-id={k} num-partitions=2 state-dir="{tmp_path / f"node-{k}"}"')
        res = fed.flwr("run", str(EXAMPLE), CONNECTION, "--stream", "--run-config",
                       f'out="{out}" fedblend.method="{method}" fedblend.rounds=2', timeout=500)
    log = (tmp_path / "fed" / "flwr-run.log").read_text(errors="replace")
    assert res.returncode == 0 and (out / "summary.json").exists(), log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["method"] == method and summary["rounds"] == 2, log[-3000:]
    sim, flw = history(tmp_path / "sim"), history(out)
    assert len(sim) == len(flw) == 2
    for a, b in zip(sim, flw):
        assert {k: a.get(k) for k in SCORES} == {k: b.get(k) for k in SCORES}, method
    assert "flower_faults" not in json.dumps(flw)
    assert _children() == []
    print(f"{method}: flwr run of examples/flower-app took {time.monotonic() - t0:.0f}s")
