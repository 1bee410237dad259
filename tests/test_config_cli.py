import json

import pytest

from fedblend.cli.main import main
from fedblend.config import ConfigError, config_from_dict, load_config


@pytest.mark.parametrize("raw,match", [
    ({"method": "fedfoo"}, r"method: unknown method 'fedfoo'; choose one of \[.*'fedavg'"),
    ({"dataset": "imagenet"}, r"dataset must be one of \[.*'fmnist'"),
    ({"model": "vgg"}, r"model must be one of \[.*'lenet5'"),
    ({"rounds": 0}, r"rounds must be \[1, 1000000\]"),
    ({"rounds": "ten"}, "rounds must be an integer"),
    ({"train": {"lrr": 0.1}}, r"unknown field train.lrr; allowed: batch_size, drop_last, epochs, lr"),
    ({"train": {"lr": "fast"}}, r"train.lr must be a number, got 'fast'"),
    ({"train": {"optimizer_state": "forever"}}, r"train.optimizer_state must be one of \['reset', 'keep'\]"),
    ({"partition": {"kind": "voronoi"}}, r"partition.kind must be one of \['iid', 'dirichlet'"),
    ({"partition": {"split": "half"}}, r"partition.split must be one of \['official', 'merge', 'train_val_test'\]"),
    ({"sampling": {"scheme": "all"}}, r"sampling.scheme must be one of \['fixed', 'uniform_range'\]"),
    ({"options": {"mu": 0.1}}, r"unknown field options.mu; allowed: \(none\)"),
    ({"method": "fedprox", "options": {"mu": "x"}}, r"options.mu must be a number"),
    ({"colour": "red"}, r"unknown field 'colour'; allowed:"),
])
def test_bad_config_errors_name_field_and_allowed_values(raw, match):
    with pytest.raises(ConfigError, match=match):
        config_from_dict(raw)


def test_set_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('method = "fedavg"\nrounds = 50\n[partition]\nalpha = 0.1\n')
    cfg = load_config(p, ["rounds=5", "seed=1", "partition.alpha=0.5", "method=fedprox", "options.mu=0.1",
                          "sampling.scheme=uniform_range"])
    assert (cfg.rounds, cfg.seed, cfg.partition.alpha, cfg.method, cfg.options) == (5, 1, 0.5, "fedprox", {"mu": 0.1})
    assert cfg.sampling.scheme == "uniform_range"
    with pytest.raises(ConfigError, match="key=value"):
        load_config(p, ["rounds"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml")


def test_cli_run_report_and_error_exit(tmp_path, capsys):
    args = ["--set", "dataset=synthetic", "--set", "model=mlp", "--set", "rounds=2", "--set", "partition.num_clients=3",
            "--set", "partition.min_samples=5", "--set", "train.lr=0.05", "--quiet"]
    for seed in (0, 1):
        assert main(["run", *args, "--set", f"seed={seed}", "--out", str(tmp_path / "runs" / f"s{seed}")]) == 0
    out = capsys.readouterr().out
    assert '"best_accuracy"' in out
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "rep")]) == 0
    table = (tmp_path / "rep" / "table.md").read_text()
    assert "| synthetic-dirichlet-fedavg | " in table and " | 2 | 2 |" in table and "±" in table
    assert (tmp_path / "rep" / "accuracy.png").stat().st_size > 1000
    rows = json.loads((tmp_path / "rep" / "table.json").read_text())
    assert rows[0]["seeds"] == [0, 1]
    assert main(["run", "--set", "train.lrr=1", "--out", str(tmp_path / "bad")]) == 2
    assert "unknown field train.lrr" in capsys.readouterr().err


def test_cli_partition_command(tmp_path, capsys):
    assert main(["partition", "--set", "dataset=synthetic", "--set", "partition.num_clients=3",
                 "--set", "partition.min_samples=5", "--out", str(tmp_path)]) == 0
    assert "client |" in capsys.readouterr().out
    assert (tmp_path / "partition.png").exists() and (tmp_path / "partition.json").exists()


def test_partition_save_and_reload(tmp_path, tiny_fed):
    from fedblend.data.federated import build_federated, load_partition
    from fedblend.data.synthetic import make_synthetic

    tiny_fed.save(tmp_path / "p.json")
    idx, spec = load_partition(tmp_path / "p.json")
    again = build_federated(make_synthetic(), spec, seed=999, indices=idx)  # the seed no longer matters
    assert (again.counts["train"] == tiny_fed.counts["train"]).all()
    assert all((a.train_y == b.train_y).all() for a, b in zip(again.clients, tiny_fed.clients))


def test_benchmark_configs_validate():
    from pathlib import Path

    for p in sorted(Path(__file__).resolve().parents[1].glob("configs/**/*.toml")):
        cfg = load_config(p)
        if p.parent.name == "benchmarks":  # report groups seeds by name: a benchmark's name is its file's stem
            assert cfg.name == p.stem, p
