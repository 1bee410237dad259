"""PartialFed: the partial load, the strategy's threshold and step, the first round is FedAvg, +ala where the paper
has a global model, non-default options (also of the other own-loop methods) train and resume."""

from __future__ import annotations

import math

import pytest
import torch

from fedblend.algorithms import build_method
from fedblend.algorithms.partialfed import gumbel_relax, mix, partial_load, strategy_step
from fedblend.algorithms.parts.ownloop import batch_loss
from fedblend.core.message import Message
from tests.helpers import tiny_sim
from tests.methods.common import toy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_partialfed_loads_global_layers_and_keeps_local_ones():
    glob = {"fc1.weight": torch.ones(2, 2), "fc1.bias": torch.ones(2), "fc2.weight": torch.ones(1, 2)}
    local = {k: torch.zeros_like(v) for k, v in glob.items()}
    out = partial_load(glob, local, {"fc1": True, "fc2": False})
    assert [float(out[k].flatten()[0]) for k in glob] == [1.0, 1.0, 0.0]  # fc1 global (ones), fc2 local (zeros)
    per_tensor = partial_load(glob, local, {"fc1.weight": False, "fc1.bias": True, "fc2.weight": True}, "tensor")
    assert [float(per_tensor[k].flatten()[0]) for k in glob] == [0.0, 1.0, 1.0]


def test_partialfed_client_init_thresholds_the_strategy(tiny_fed):
    sim = tiny_sim(tiny_fed, "partialfed", rounds=1)
    names = list(sim.run_info.init_params)
    glob = {k: torch.ones_like(v) for k, v in sim.run_info.init_params.items()}
    local = {k: torch.zeros_like(v) for k, v in glob.items()}
    layers = sorted({k.rsplit(".", 1)[0] for k in names})
    s = {ly: torch.tensor(0.7 if i % 2 == 0 else 0.2) for i, ly in enumerate(layers)}
    init = sim.method.client_init(Message({"params": glob}), {"params": local, "strategy": s}, None)
    for k in names:
        assert torch.equal(init[k], glob[k] if float(s[k.rsplit(".", 1)[0]]) >= 0.5 else local[k]), k


def test_partialfed_strategy_step_is_the_layer_mean_gradient():
    model, glob, data = toy()
    local = {k: v * 0.3 - 0.1 for k, v in glob.items()}
    f = batch_loss(model, *data[0])
    s = {"0": torch.tensor(0.6, dtype=torch.float64), "2": torch.tensor(0.4, dtype=torch.float64)}
    leaf = {u: v.clone().requires_grad_(True) for u, v in s.items()}
    ds = torch.autograd.grad(f(mix(glob, local, leaf)), [leaf["0"], leaf["2"]])
    numel = {u: sum(v.numel() for k, v in glob.items() if k.startswith(u + ".")) for u in s}
    new = strategy_step(s, glob, local, f, eta=0.5, unit="layer")
    for u, d in zip(["0", "2"], ds):
        assert torch.allclose(new[u], (s[u] - 0.5 * d / numel[u]).clamp(0, 1)), u
    cold = gumbel_relax(s, 1e-3, torch.Generator().manual_seed(0))
    assert all(min(float(v), 1 - float(v)) < 1e-6 for v in cold.values())  # low temperature: a hard choice


def test_partialfed_first_round_is_fedavg_and_learns_later(tiny_fed):
    a = tiny_sim(tiny_fed, "partialfed", rounds=3, seed=2)
    b = tiny_sim(tiny_fed, "fedavg", rounds=3, seed=2)
    a.run_round(), b.run_round()
    assert all(torch.equal(a.server["global"][k], b.server["global"][k]) for k in a.server["global"])
    a.run_round()
    assert any(int(st["rounds"]) > 0 for st in a.store.states.values())


def test_registered_with_ala_where_the_paper_has_a_global_model():
    for m in ("perfedavg", "pfedme", "partialfed"):
        assert [t.name for t in build_method(f"{m}+ala").transforms] == ["ala"]
    with pytest.raises(ValueError, match="no global model"):
        build_method("fedfomo+ala")



@pytest.mark.parametrize("method,options", [
    ("perfedavg", {"variant": "hf", "local_steps": 3}),
    ("pfedme", {"inner_init": "w", "local_steps": 4, "beta": 2.0}),
    ("fedfomo", {"candidates": "last_round", "val_split": "train", "m": 1, "epsilon": 1.0}),
    ("partialfed", {"load": "soft", "unit": "tensor", "gumbel": False}),
])
def test_non_default_options_train_and_resume(method, options, tiny_fed, tmp_path):
    from tests.helpers import same_state, without_timings

    sim = tiny_sim(tiny_fed, method, options, rounds=3, seed=1, join_ratio=0.5)
    sim.run_round(), sim.run_round()
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, method, options, rounds=3, seed=1, join_ratio=0.5)
    twin.restore(tmp_path / "ck.pt")
    assert same_state(twin.server, sim.server) and same_state(twin.store.states, sim.store.states)
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0 and math.isfinite(sim.history[-1]["train_loss"])
