"""FedFomo: the first-order model weights and update (Eq. 5-7) by hand, model selection, what travels."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.fedfomo import fomo_update, fomo_weights, select_models
from tests.helpers import tiny_sim

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedfomo_weights_by_hand():
    w = fomo_weights(1.0, [0.5, 1.2, 0.8], [2.0, 1.0, 0.5])
    raw = torch.tensor([0.5 / 2.0, 0.0, 0.2 / 0.5], dtype=torch.float64)  # max(L_i - L_n, 0) / ||theta_n - theta_i||
    assert torch.allclose(w, raw / raw.sum())
    assert torch.equal(fomo_weights(1.0, [1.5, 1.0], [1.0, 1.0]), torch.zeros(2, dtype=torch.float64))


def test_fedfomo_update_by_hand():
    own = {"a": torch.tensor([0.0, 0.0])}
    models = [{"a": torch.tensor([1.0, 0.0])}, {"a": torch.tensor([0.0, 2.0])}]
    out = fomo_update(own, models, torch.tensor([0.25, 0.75]))
    assert torch.allclose(out["a"], torch.tensor([0.25, 1.5]))
    assert torch.equal(fomo_update(own, models, torch.zeros(2))["a"], own["a"])


def test_fedfomo_selection_top_m_and_exploration():
    aff = torch.tensor([0.0, 0.5, 0.1, 0.9, 0.2], dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    assert select_models(aff, [1, 2, 3, 4], 2, 0.0, gen) == [1, 3]
    assert select_models(aff, [2], 5, 0.0, gen) == [2]
    picks = {tuple(select_models(aff, [1, 2, 3, 4], 2, 1.0, gen)) for _ in range(30)}
    assert len(picks) > 1 and all(len(p) == 2 and set(p) <= {1, 2, 3, 4} for p in picks)


def test_fedfomo_sends_m_other_models_and_counts_their_bytes(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedfomo", {"m": 2}, rounds=3, seed=0)
    sim.run()
    model_bytes = sum(t.numel() * t.element_size() for t in sim.run_info.init_params.values())
    assert sim.history[0]["bytes_down"] == [0] * 4  # nothing stored before the first uploads
    assert sim.history[1]["bytes_down"] == [2 * model_bytes] * 4
    assert sim.history[1]["bytes_up"] == [model_bytes] * 4
    assert float(sim.server["affinity"].diagonal().abs().sum()) == 0.0  # a client never receives its own model
    assert float(sim.server["affinity"].sum()) > 0
