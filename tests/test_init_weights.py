"""The config's ``init``: a run starts from the weights of a state_dict file in place of the seeded draw (e.g. a
reference implementation's initial model, or a pretrained one); a file that does not fit the model is a one-line
ConfigError naming what differs; a config without it records and hashes as before."""

from __future__ import annotations

import pytest
import torch

from fedblend.common.errors import ConfigError
from fedblend.config import config_from_dict, config_hash
from fedblend.experiment import build_data, create_simulation
from fedblend.models import build_model

TINY = {"dataset": "synthetic", "model": "mlp", "rounds": 1, "seed": 0,
        "partition": {"kind": "iid", "num_clients": 3}, "train": {"batch_size": 16}}


def _weights(cfg, seed: int) -> dict[str, torch.Tensor]:
    info = build_data(cfg).info
    return build_model(cfg.model, info, torch.Generator().manual_seed(seed)).state_dict()


def test_init_file_replaces_the_seeded_draw(tmp_path):
    cfg = config_from_dict(TINY)
    saved = _weights(cfg, 1234)
    torch.save(saved, tmp_path / "w.pt")
    drawn = create_simulation(cfg, build_data(cfg)).run_info.init_params
    loaded = create_simulation(config_from_dict({**TINY, "init": str(tmp_path / "w.pt")}),
                               build_data(cfg)).run_info.init_params
    assert set(loaded) == set(saved)
    assert all(torch.equal(loaded[k], saved[k]) for k in saved)
    assert not all(torch.equal(drawn[k], saved[k]) for k in saved)  # the file, not the seed's draw


def test_init_file_that_does_not_fit_names_the_difference(tmp_path):
    cfg = config_from_dict(TINY)
    saved = _weights(cfg, 0)
    extra = {**saved, "fc9.weight": torch.zeros(2)}
    torch.save(extra, tmp_path / "extra.pt")
    with pytest.raises(ConfigError, match=r"unexpected \['fc9.weight'\]"):
        create_simulation(config_from_dict({**TINY, "init": str(tmp_path / "extra.pt")}), build_data(cfg))
    k = next(iter(saved))
    torch.save({**saved, k: torch.zeros(3, 3)}, tmp_path / "shape.pt")
    with pytest.raises(ConfigError, match=rf"other shapes than the model's: {k} \(3, 3\)"):
        create_simulation(config_from_dict({**TINY, "init": str(tmp_path / "shape.pt")}), build_data(cfg))
    (tmp_path / "junk.pt").write_text("not a torch file")
    with pytest.raises(ConfigError, match="not a readable torch file"):
        create_simulation(config_from_dict({**TINY, "init": str(tmp_path / "junk.pt")}), build_data(cfg))
    with pytest.raises(ConfigError, match="is not a file"):
        config_from_dict({**TINY, "init": str(tmp_path / "absent.pt")})


def test_config_without_init_records_and_hashes_as_before(tmp_path):
    plain = config_from_dict(TINY).resolved()
    assert "init" not in plain  # runs from the seeded draw keep their recorded config and identity
    torch.save(_weights(config_from_dict(TINY), 0), tmp_path / "w.pt")
    with_init = config_from_dict({**TINY, "init": str(tmp_path / "w.pt")}).resolved()
    assert with_init["init"] == str(tmp_path / "w.pt")
    assert config_hash(with_init) != config_hash(plain)
