"""bookkeeping/reference_init.py: the reference's seed-0 initial weights drawn by fedblend's own model code (#51)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "results" / "validation" / "init" / "pflib-seed0-cnn4-fmnist.pt"
INIT = COMMITTED.parent


def _default_init_cnn4(seed: int) -> list[torch.Tensor]:
    """``torch.manual_seed(seed)`` then PyTorch's own constructors of cnn4's layers, in their order (how a
    reference implementation that seeds the global RNG draws its model)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers = [nn.Conv2d(1, 32, 5), nn.Conv2d(32, 64, 5), nn.Linear(1024, 512), nn.Linear(512, 10)]
    return [t for layer in layers for t in (layer.weight.detach(), layer.bias.detach())]


def test_reference_state_equals_global_seed_draw_of_torch_constructors():
    mod = load_script("reference_init", "bookkeeping")
    for seed in (0, 3):
        ours = list(mod.reference_state("cnn4", (1, 28, 28), 10, seed).values())
        want = _default_init_cnn4(seed)
        assert [tuple(t.shape) for t in ours] == [tuple(t.shape) for t in want]
        assert all(torch.equal(a, b) for a, b in zip(ours, want))
    assert not torch.equal(mod.reference_state("cnn4", (1, 28, 28), 10, 1)["fc.weight"],
                           mod.reference_state("cnn4", (1, 28, 28), 10, 0)["fc.weight"])


def test_committed_pflib_init_file_is_what_the_script_writes(tmp_path):
    mod = load_script("reference_init", "bookkeeping")
    committed = torch.load(COMMITTED, weights_only=True)
    assert mod.tensors_sha256(committed) == mod.tensors_sha256(mod.reference_state("cnn4", (1, 28, 28), 10, 0))
    out = tmp_path / "w.pt"
    assert mod.main([str(out), "--model", "cnn4", "--input", "1,28,28", "--classes", "10", "--seed", "0"]) == 0
    again = torch.load(out, weights_only=True)
    assert list(again) == list(committed) and all(torch.equal(again[k], committed[k]) for k in committed)


def test_every_committed_pflib_init_file_is_the_script_draw_of_the_seed_its_name_gives():
    mod = load_script("reference_init", "bookkeeping")
    files = sorted(INIT.glob("pflib-seed*-cnn4-fmnist.pt"))
    assert len(files) >= 3
    readme = (INIT / "README.md").read_text()
    for f in files:
        seed = int(f.name.removeprefix("pflib-seed").split("-")[0])
        digest = mod.tensors_sha256(torch.load(f, weights_only=True))
        assert digest == mod.tensors_sha256(mod.reference_state("cnn4", (1, 28, 28), 10, seed)), f.name
        assert digest in readme, f"{f.name}: its tensors' hash is not in init/README.md"
