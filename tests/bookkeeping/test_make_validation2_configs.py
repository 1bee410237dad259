"""bookkeeping/make_validation2_configs.py: the second validation setting's configs (docs/validation-2.md)."""

from __future__ import annotations

from pathlib import Path

import tomllib

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]


def test_committed_second_setting_configs_are_what_the_script_writes(tmp_path):
    mod = load_script("make_validation2_configs", "bookkeeping")
    assert mod.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.glob("*.toml"))
    committed = sorted(p.name for p in (ROOT / "configs" / "validation-2").glob("*.toml"))
    assert written == committed and "fedavg-ft.toml" in written and "local.toml" in written
    for name in written:
        assert (tmp_path / name).read_text() == (ROOT / "configs" / "validation-2" / name).read_text(), name


def test_second_setting_replaces_the_setting_and_keeps_the_method_options():
    mod = load_script("make_validation2_configs", "bookkeeping")
    first = tomllib.loads((ROOT / "configs" / "validation" / "fedala.toml").read_text())
    second = mod.second_setting(first, "fedala")  # the admitted setting (docs/validation-2.md)
    assert second["options"] == first["options"] and second["model"] == "cnn4" and second["rounds"] == 50
    assert second["dataset"] == "mnist" and first["dataset"] == "fmnist"
    part = second["partition"]
    assert (part["alpha"], part["num_clients"], part["pool_fraction"], part["rule"]) == (1.0, 50, 0.15, "pflib")
    assert part["seed"] == 0  # every run seed on the one partition both sides read
    assert (second["train"]["lr"], second["train"]["batch_size"]) == (0.05, 10)
    perfedavg = mod.second_setting(tomllib.loads((ROOT / "configs" / "validation" / "perfedavg.toml").read_text()),
                                   "perfedavg", 0.2)
    assert perfedavg["train"]["epochs"] == 2 and perfedavg["partition"]["pool_fraction"] == 0.2


def test_alpha_and_rounds_choose_the_replacement_settings(tmp_path):
    mod = load_script("make_validation2_configs", "bookkeeping")
    assert mod.main(["--out", str(tmp_path), "--dataset", "fmnist", "--pool", "0.3", "--alpha", "0.5",
                     "--rounds", "20", "--lr", "0.005"]) == 0  # pilot 1's setting
    text = (tmp_path / "fedala.toml").read_text()
    cfg = tomllib.loads(text)
    assert (cfg["partition"]["alpha"], cfg["rounds"], cfg["partition"]["pool_fraction"]) == (0.5, 20, 0.3)
    assert (cfg["dataset"], cfg["train"]["lr"]) == ("fmnist", 0.005)
    assert "Dir(0.5)" in text and "20 rounds" in text and "Fashion-MNIST" in text


def test_dataset_and_lr_choose_the_mnist_settings(tmp_path):
    mod = load_script("make_validation2_configs", "bookkeeping")
    assert mod.main(["--out", str(tmp_path), "--dataset", "mnist", "--pool", "0.15", "--alpha", "1.0",
                     "--rounds", "50", "--lr", "0.05"]) == 0
    text = (tmp_path / "fedrep.toml").read_text()
    cfg = tomllib.loads(text)
    first = tomllib.loads((ROOT / "configs" / "validation" / "fedrep.toml").read_text())
    assert (cfg["dataset"], cfg["train"]["lr"], cfg["partition"]["pool_fraction"]) == ("mnist", 0.05, 0.15)
    assert cfg["options"] == first["options"] and cfg["train"]["batch_size"] == 10
    assert "MNIST, a 0.15 pool" in text and "SGD lr 0.05 " in text


def test_an_option_the_first_setting_derived_from_its_client_count_is_derived_again():
    mod = load_script("make_validation2_configs", "bookkeeping")
    first = tomllib.loads((ROOT / "configs" / "validation" / "pfedhn.toml").read_text())
    second = mod.second_setting(first, "pfedhn")
    assert first["options"]["embed_dim"] == int((1 + 20) / 4) == 5  # FL-bench's default at the first setting's 20
    assert second["options"]["embed_dim"] == int((1 + 50) / 4) == 12  # ... and at the second setting's 50 clients
    assert {k: v for k, v in second["options"].items() if k != "embed_dim"} == \
        {k: v for k, v in first["options"].items() if k != "embed_dim"}


def test_methods_without_a_reference_get_fedavgs_setting_and_their_default_options():
    """FedALP, FedAPA, FedProx, PartialFed (no reference implementation) are written for the paired table: FedAvg's
    first-setting config moved to the second setting, the method replaced, no options (their defaults)."""
    mod = load_script("make_validation2_configs", "bookkeeping")
    fedavg = tomllib.loads((ROOT / "configs" / "validation-2" / "fedavg.toml").read_text())
    for method in mod.UNREFERENCED:
        text = (ROOT / "configs" / "validation-2" / f"{method}.toml").read_text()
        cfg = tomllib.loads(text)
        assert cfg["method"] == method and "options" not in cfg and "no reference implementation" in text
        assert {k: v for k, v in cfg.items() if k not in ("method", "name")} == \
            {k: v for k, v in fedavg.items() if k not in ("method", "name")}
