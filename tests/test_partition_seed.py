"""``partition.seed``: several run seeds on one partition (docs/validation-2.md's seeds 0-2), unset = the run's."""

from __future__ import annotations

import json

import pytest

from fedblend.cli.main import main
from fedblend.common.errors import ConfigError
from fedblend.data.federated import PartitionSpec, build_federated
from fedblend.data.synthetic import make_synthetic


def _spec(**kw) -> PartitionSpec:
    return PartitionSpec(kind="dirichlet", alpha=0.5, num_clients=4, min_samples=5, split="merge",
                         pool_fraction=0.8, **kw)


def test_partition_seed_fixes_the_partition_across_run_seeds_and_unset_follows_the_run_seed():
    raw = make_synthetic()
    fixed = [build_federated(raw, _spec(seed=7), seed=s).indices for s in (0, 1, 2)]
    assert fixed[0] == fixed[1] == fixed[2]
    assert fixed[0] == build_federated(raw, _spec(), seed=7).indices  # partition.seed 7 = the run seed 7's draw
    follows = [build_federated(raw, _spec(), seed=s).indices for s in (0, 1)]
    assert follows[0] != follows[1]  # unset: each run seed draws its own (the behaviour before the option)
    assert build_federated(raw, _spec(seed=8), seed=0).indices != fixed[0]


def test_partition_seed_with_a_read_partition_is_refused():
    with pytest.raises(ConfigError, match="partition.seed seeds a drawn partition"):
        PartitionSpec(kind="indices", path="x.json", seed=0).validate("partition")


def test_runs_of_two_seeds_on_one_partition_record_it_and_differ_only_in_training(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDBLEND_DATA", str(tmp_path / "data"))
    cfg = tmp_path / "c.toml"
    cfg.write_text('dataset = "synthetic"\nmodel = "mlp"\nrounds = 1\n[partition]\nnum_clients = 3\nmin_samples = 5\n'
                   "seed = 0\n")
    parts = {}
    for s in (0, 1):
        out = tmp_path / f"run{s}"
        assert main(["run", str(cfg), "--set", f"seed={s}", "--out", str(out), "--quiet"]) == 0
        parts[s] = json.loads((out / "partition.json").read_text())["indices"]
        assert "seed = 0" in (out / "config.toml").read_text().split("[partition]")[1]
    assert parts[0] == parts[1]
    assert (tmp_path / "run0" / "metrics.jsonl").read_text() != (tmp_path / "run1" / "metrics.jsonl").read_text()
