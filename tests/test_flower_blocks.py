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


def flwr_run(app: Path, tmp: Path, run_config: str, nodes: int = 2, timeout: float = 500):
    """``flwr run APP --run-config RUN_CONFIG`` on a loopback SuperLink and ``nodes`` SuperNodes (partition-id K
    of ``nodes``, their states under ``tmp``): (the completed process, the ``flwr run`` log)."""
    from fedblend.flower.deploy import CONNECTION, local_federation

    with local_federation(tmp / "fed") as fed:
        fed.start_superlink()
        for k in range(nodes):
            fed.start_supernode(k, f'partition-id={k} num-partitions={nodes} state-dir="{tmp / f"node-{k}"}"')
        res = fed.flwr("run", str(app), CONNECTION, "--stream", "--run-config", run_config, timeout=timeout)
    return res, (tmp / "fed" / "flwr-run.log").read_text(errors="replace")


def flwr_equals_fedblend_run(app: Path, config: Path, tmp: Path, method: str, sets: list[str],
                             run_config: str, scores=SCORES) -> tuple[list[dict], Path]:
    """``fedblend run CONFIG --set ...`` and ``flwr run APP`` (:func:`flwr_run`, results in ``tmp/flw``) of the same
    config: the Flower run finished every round with no fault, its per-round ``scores`` equal ``fedblend run``'s,
    no Flower process is left. Returns the Flower run's metrics rows and its results directory."""
    from .test_flower import _children

    assert main(["run", str(config), *[f"--set={s}" for s in [f"method={method!r}", *sets]], "--out",
                 str(tmp / "sim"), "--threads", "1", "--quiet"]) == 0
    out = tmp / "flw"
    t0 = time.monotonic()
    res, log = flwr_run(app, tmp, f'out="{out}" fedblend.method="{method}" {run_config}')
    assert res.returncode == 0 and (out / "summary.json").exists(), log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    sim, flw = history(tmp / "sim"), history(out)
    assert summary["status"] == "finished" and summary["method"] == method, log[-3000:]
    assert summary["rounds"] == len(sim) == len(flw), log[-3000:]
    for a, b in zip(sim, flw):
        assert {k: a.get(k) for k in scores} == {k: b.get(k) for k in scores}, method
    assert "flower_faults" not in json.dumps(flw)
    assert _children() == []
    print(f"{method}: flwr run of {app.name} took {time.monotonic() - t0:.0f}s")
    return flw, out


@pytest.mark.parametrize("method", ["fedavg", *(pytest.param(m, marks=pytest.mark.slow)
                                                for m in ("fedala", "fedapa", "pfedrlla"))])
def test_example_app_equals_fedblend_run(method, tmp_path, flwr_bin):
    flw, _ = flwr_equals_fedblend_run(EXAMPLE, CONFIG, tmp_path, method, ["rounds=2"], "fedblend.rounds=2")
    assert len(flw) == 2
