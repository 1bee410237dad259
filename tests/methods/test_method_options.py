"""Non-default options of pFedHN, pFedLA, FedPAC and DBE run and keep their states data; DBE's global-mean rule and
its one-by-one run under vmap."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import tiny_sim

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("spec,options", [
    ("pfedhn", {"sequential": False, "inner_steps": 3, "embed_dim": 2}),
    ("pfedla", {"granularity": "tensor", "sequential": True, "sign": "literal", "hn_momentum": 0.5}),
    ("fedpac", {"centroids": "mean", "align_norm": "sum", "weight_eps": 0.05, "head_lr": 0.1}),
    ("fedpac", {"head_epochs": 0}),
    ("dbe", {"global_mean": "every"}),
])
def test_non_default_options_run_and_states_stay_data(spec, options, tiny_fed):
    from fedblend.common.codec import decode, encode
    from tests.helpers import same_state

    sim = tiny_sim(tiny_fed, spec, options, rounds=2, join_ratio=0.5)
    sim.run()
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0
    assert same_state(decode(encode(sim.server)), sim.server)


def test_dbe_global_mean_first_is_kept_and_every_refreshes(tiny_fed):
    first = tiny_sim(tiny_fed, "dbe", rounds=3)
    first.run_round()
    kept = first.server["global_mean"].clone()
    first.run_round()
    assert torch.equal(first.server["global_mean"], kept)
    every = tiny_sim(tiny_fed, "dbe", {"global_mean": "every"}, rounds=3)
    every.run_round()
    assert torch.equal(every.server["global_mean"], kept)
    every.run_round()
    assert not torch.equal(every.server["global_mean"], kept)


def test_dbe_on_the_vmap_backend_runs_its_own_forward_one_by_one(tiny_fed):
    from fedblend.core.vmap import VmapBackend

    a = tiny_sim(tiny_fed, "dbe", {"kappa": 0.0}, rounds=2, seed=1)
    b = tiny_sim(tiny_fed, "dbe", {"kappa": 0.0}, rounds=2, seed=1, backend=VmapBackend())
    a.run()
    with pytest.warns(RuntimeWarning, match="one by one"):
        b.run()
    for cid, st in a.store.states.items():
        assert torch.allclose(st["prbm"], b.store.states[cid]["prbm"], atol=1e-6)
    for ma, mb in zip(a.history, b.history):
        assert ma["train_loss"] == pytest.approx(mb["train_loss"], rel=1e-5)
    # round 1 has no global mean yet (plain specs, batched); round 2 trains the bias with DBE's forward
    assert "vmap_one_by_one_forward" not in b.history[0]
    assert b.history[1]["vmap_one_by_one_forward"] == len(b.history[1]["selected"])
