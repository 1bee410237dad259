"""The user-facing diagnostics in ``scripts/`` (docs/workflow.md, "Diagnostics of a run") run on a tiny run
directory of their method and write what their docstrings promise; ``scripts/flower_certs.py`` writes a
deployment's certificates and node keys. ``scripts/ala_weights.py`` is tested in tests/test_fedala.py and
tests/test_figures.py, ``scripts/pfedrlla_plots.py``'s computations in tests/test_pfedrlla.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedblend.cli.main import main

REPO = Path(__file__).resolve().parents[1]
TINY = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "partition.num_clients=4",
        "--set", "partition.min_samples=5", "--set", "log.plot=false", "--quiet", "--threads", "1"]


def _script(name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, str(REPO / "scripts" / f"{name}.py"), *args], capture_output=True,
                          text=True, timeout=600, env=env)


def _run(tmp_path: Path, method: str, *sets: str) -> Path:
    out = tmp_path / method
    flags = [x for s in sets for x in ("--set", s)]
    assert main(["run", *TINY, "--set", f"method={method}", *flags, "--out", str(out)]) == 0
    assert (out / "checkpoint.pt").is_file()
    return out


def test_fedapa_heatmap_draws_the_snapshots_and_the_latest_matrix(tmp_path):
    pytest.importorskip("matplotlib")
    run = _run(tmp_path, "fedapa", "rounds=2", "options.heatmap_rounds=[1]")
    res = _script("fedapa_heatmap", str(run), "--out", str(tmp_path / "img"))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in (tmp_path / "img").glob("*.png")) == ["fedapa_weights_latest.png",
                                                                        "fedapa_weights_round0001.png"]


def test_fedalp_plots_report_each_clustering_and_draw_it(tmp_path):
    pytest.importorskip("matplotlib")
    run = _run(tmp_path, "fedalp", "rounds=3", "options.t_pre=1", "options.num_groups=2")
    res = _script("fedalp_plots", str(run), "--out", str(tmp_path / "img"))
    assert res.returncode == 0, res.stderr
    report = json.loads((tmp_path / "img" / "fedalp_clustering.json").read_text())
    (clustering,) = report["clusterings"]  # FedALP clusters once, at the end of the warm-up (t_pre = 1)
    assert clustering["clients"] == [0, 1, 2, 3] and sorted(set(clustering["group"])) == [0, 1]
    assert sum(clustering["group_sizes"]) == 4 and len(clustering["psi"]) == 2
    assert (tmp_path / "img" / "fedalp_similarity_0.png").stat().st_size > 0
    assert (tmp_path / "img" / "fedalp_psi_0.png").stat().st_size > 0


def test_pfedrlla_plots_draw_reward_weights_embeddings_and_time(tmp_path):
    pytest.importorskip("matplotlib")
    run = _run(tmp_path, "pfedrlla", "rounds=3", "options.random_rounds=1", "options.update_every=1",
               "options.batch=2", "options.emb_dim=8", "options.factor=4", "options.hidden=16")
    res = _script("pfedrlla_plots", str(run), "--out", str(tmp_path / "img"))
    assert res.returncode == 0, res.stderr
    for name in ("reward", "head_weights", "embeddings", "time"):
        assert (tmp_path / "img" / f"pfedrlla_{name}.png").stat().st_size > 0, name


def test_flower_certs_writes_the_ca_the_superlinks_pair_and_one_key_pair_per_node(tmp_path):
    pytest.importorskip("cryptography")
    res = _script("flower_certs", "--out", str(tmp_path / "certs"), "--hosts", "localhost", "--nodes", "2")
    assert res.returncode == 0, res.stderr
    names = {p.name for p in (tmp_path / "certs").iterdir()}
    assert {"ca.crt", "server.crt", "server.key"} <= names
    assert sorted(n for n in names if n.startswith("node-")) == ["node-0", "node-0.pub", "node-1", "node-1.pub"]
