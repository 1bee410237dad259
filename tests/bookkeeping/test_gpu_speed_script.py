"""``bookkeeping/gpu_speed.py``: the GPU-speed table's one-run command writes ``speed.json`` with every config's
sequential and vmap rows (``fedblend bench --backends``), the device named; run here on the CPU on tiny data."""

from __future__ import annotations

import json

from tests.helpers import load_script


def test_gpu_speed_writes_one_row_per_config_with_both_backends_on_the_cpu(tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('dataset = "synthetic"\nmodel = "mlp"\n[partition]\nnum_clients = 4\nmin_samples = 5\n')
    speed = load_script("gpu_speed", "bookkeeping")
    assert speed.main([str(tmp_path / "out"), "--device", "cpu", "--threads", "1", "--rounds", "1",
                       "--configs", str(cfg)]) == 0
    doc = json.loads((tmp_path / "out" / "speed.json").read_text())
    assert doc["device"] == "cpu" and len(doc["configs"]) == 1
    assert set(doc["configs"][0]["backends"]) == {"sequential", "vmap"}
