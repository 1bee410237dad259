"""Options that reproduce a reference implementation's protocol (docs/validation.md): ``train.drop_last`` (PFLlib's
``DataLoader(drop_last=True)``) and ``partition.pool_fraction`` (a seeded subset of the pool, for cheap side by
side runs on identical data)."""

import numpy as np
import pytest
import torch

from fedblend.algorithms.parts.ownloop import batch_stream, steps_per_epochs
from fedblend.common.errors import ConfigError
from fedblend.core.training import TrainConfig, batches, sgd_train
from fedblend.data.federated import PartitionSpec, build_federated
from fedblend.data.synthetic import make_synthetic


def test_batches_drop_last_drops_the_partial_batch():
    g = torch.Generator().manual_seed(0)
    kept = [len(b) for b in batches(130, 64, 2, g)]
    assert kept == [64, 64, 2, 64, 64, 2]
    g = torch.Generator().manual_seed(0)
    dropped = list(batches(130, 64, 2, g, drop_last=True))
    assert [len(b) for b in dropped] == [64, 64, 64, 64]
    assert all(len(set(b.tolist())) == 64 for b in dropped)
    assert list(batches(50, 64, 3, torch.Generator().manual_seed(0), drop_last=True)) == []
    assert steps_per_epochs(130, 64, 2) == 6 and steps_per_epochs(130, 64, 2, drop_last=True) == 4
    assert steps_per_epochs(50, 64, 1, drop_last=True) == 0
    stream = batch_stream(130, 64, torch.Generator().manual_seed(0), drop_last=True)
    assert [len(next(stream)) for _ in range(5)] == [64] * 5


@pytest.mark.parametrize("n, kept_steps, dropped_steps", [(130, 3, 2), (50, 1, 0)])
def test_sgd_train_drop_last_steps(n, kept_steps, dropped_steps):
    model = torch.nn.Linear(4, 3)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, y = torch.randn(n, 4), torch.randint(0, 3, (n,))
    for drop, steps in ((False, kept_steps), (True, dropped_steps)):
        cfg = TrainConfig(lr=0.1, batch_size=64, epochs=1, drop_last=drop)
        res = sgd_train(model, params, x, y, cfg, torch.Generator().manual_seed(0))
        assert res.steps == steps
        assert res.samples == (n if not drop else 64 * steps)
        if steps == 0:  # a client smaller than a batch does not train under drop_last (as PFLlib)
            assert all(torch.equal(res.params[k], params[k]) for k in params)
        # steps= counts in batches of the same kind
        res2 = sgd_train(model, params, x, y, cfg, torch.Generator().manual_seed(0), steps=steps + 1)
        assert res2.steps == (0 if steps == 0 else steps + 1)


def test_pool_fraction_subsamples_the_pool_before_the_draw():
    raw = make_synthetic()
    n_pool = len(raw.train_y) + len(raw.test_y)
    full = build_federated(raw, PartitionSpec(num_clients=4, split="merge"), seed=0)
    part = build_federated(raw, PartitionSpec(num_clients=4, split="merge", pool_fraction=0.25), seed=0)
    again = build_federated(raw, PartitionSpec(num_clients=4, split="merge", pool_fraction=0.25), seed=0)
    used = [i for part_ in ("train", "test") for c in part.indices[part_] for i in c]
    assert len(used) == len(set(used)) == int(round(0.25 * n_pool))
    assert max(used) < n_pool
    assert part.indices == again.indices
    assert sum(len(c) for c in full.indices["train"]) > 3 * sum(len(c) for c in part.indices["train"])
    # the client tensors are the pool's samples at those indices, counts from the whole pool's labels
    pool_y = np.concatenate([raw.train_y, raw.test_y])
    for k, c in enumerate(part.clients):
        assert c.train_y.tolist() == pool_y[part.indices["train"][k]].tolist()
    assert int(part.counts["train"].sum()) == sum(len(c) for c in part.indices["train"])


def test_pool_fraction_needs_a_drawn_merged_partition():
    with pytest.raises(ConfigError, match="pool_fraction"):
        PartitionSpec(split="official", pool_fraction=0.5).validate("partition")
    with pytest.raises(ConfigError, match="pool_fraction"):
        PartitionSpec(kind="indices", path="x", pool_fraction=0.5).validate("partition")
    PartitionSpec(split="merge", pool_fraction=0.5).validate("partition")


def test_unshuffled_batches_take_the_data_order_and_draw_nothing():
    """``train.shuffle = false`` (PFLlib's FedFomo loader): every epoch in data order, the stream left untouched."""
    from fedblend.core.training import batch_rows

    g = torch.Generator().manual_seed(0)
    before = g.get_state()
    got = [b.tolist() for b in batches(130, 64, 2, g, shuffle=False)]
    assert got == [list(range(64)), list(range(64, 128)), [128, 129]] * 2
    assert [b.tolist() for b in batches(130, 64, 1, g, drop_last=True, shuffle=False)] == got[:2]
    rows, lens = batch_rows(130, 64, 2, g, shuffle=False)
    assert lens == [64, 64, 2] * 2 and rows[2, :2].tolist() == [128, 129] and rows[3].tolist() == list(range(64))
    stream = batch_stream(130, 64, g, shuffle=False)
    assert [next(stream).tolist() for _ in range(4)] == got[:4]
    assert torch.equal(g.get_state(), before)
    shuffled = [b.tolist() for b in batches(130, 64, 1, torch.Generator().manual_seed(0))]
    assert shuffled != got[:3] and sorted(sum(shuffled, [])) == list(range(130))


@pytest.mark.parametrize("method, options, backend", [
    ("fedavg", None, None), ("fedavg", None, "vmap"), ("apfl", {"alpha_order": "after_steps"}, None),
    ("apple", None, None), ("perfedavg", None, None), ("pfedme", None, None), ("partialfed", None, None)])
def test_every_training_loop_takes_train_shuffle(method, options, backend, tiny_fed, monkeypatch):
    """The spec path, the vmap backend and every method's own loop draw each epoch's order with the run's
    ``train.shuffle``: with ``false`` no epoch is shuffled (a loop that forgot the option would draw one)."""
    from fedblend.core import training
    from fedblend.core.backends import make_backend
    from fedblend.testing import tiny_sim

    seen = []
    real = training.epoch_order
    monkeypatch.setattr(training, "epoch_order", lambda n, g, shuffle=True: seen.append(shuffle) or real(n, g, shuffle))
    be = make_backend(backend) if backend else None
    tiny_sim(tiny_fed, method, options, rounds=1, backend=be, shuffle=False).run()
    assert seen and not any(seen)
    seen.clear()
    tiny_sim(tiny_fed, method, options, rounds=1, backend=make_backend(backend) if backend else None).run()
    assert seen and all(seen)


def test_train_shuffle_is_recorded_only_when_off_so_older_configs_keep_their_hash():
    from fedblend.config import config_from_dict
    from fedblend.config.identity import config_hash

    base = {"method": "fedavg", "dataset": "synthetic", "model": "mlp", "train": {"lr": 0.1}}
    on = config_from_dict(base).resolved()
    assert "shuffle" not in on["train"]
    assert config_hash(config_from_dict({**base, "train": {"lr": 0.1, "shuffle": True}}).resolved()) == config_hash(on)
    off = config_from_dict({**base, "train": {"lr": 0.1, "shuffle": False}})
    assert off.train.shuffle is False and off.resolved()["train"]["shuffle"] is False
    assert config_hash(off.resolved()) != config_hash(on)
