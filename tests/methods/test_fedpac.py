"""FedPAC: feature statistics, the classifier-combination QP, centroid aggregation, the alignment term."""

from __future__ import annotations

import pytest
import torch

from fedblend.algorithms.fedpac import (
    aggregate_centroids,
    alignment_loss,
    class_sums,
    combination_weights,
    feature_statistics,
    qp_matrix,
    solve_simplex_qp,
)
from fedblend.common.params import weighted_average
from fedblend.core.training import Batch
from fedblend.models.zoo import MLP
from tests.helpers import run_client, tiny_sim, train_message

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fedpac_qp_on_the_simplex_with_a_known_answer():
    """Equal statistics (D = 0): min sum alpha_j^2 V_j on the simplex -> alpha_j proportional to 1 / V_j."""
    v = torch.tensor([1.0, 2.0, 4.0])
    hs = torch.zeros(3, 2, 3)
    a = combination_weights(v, hs)
    assert torch.allclose(a.sum(1), torch.ones(3, dtype=a.dtype)) and bool((a >= 0).all())
    assert torch.allclose(a[0], torch.tensor([4 / 7, 2 / 7, 1 / 7], dtype=a.dtype), atol=1e-5)
    # a client far from the others (large bias term) and no variance anywhere keeps its own head
    hs2 = torch.zeros(3, 1, 2)
    hs2[0, 0] = torch.tensor([5.0, 0.0])
    assert torch.allclose(combination_weights(torch.zeros(3), hs2)[0], torch.tensor([1.0, 0, 0], dtype=a.dtype),
                          atol=1e-5)


def test_fedpac_class_sums_by_one_hot_product_equal_index_add():
    """The GPU's deterministic one-hot product sums the same rows per class as the CPU's ``index_add_`` (rows,
    vectors and a class no sample has)."""
    gen = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (50,), generator=gen)
    y[y == 3] = 2  # class 3 empty
    for values in (torch.randn(50, 6, generator=gen, dtype=torch.float64), torch.rand(50, generator=gen, dtype=torch.float64)):
        by_add, by_product = class_sums(values, y, 5, product=False), class_sums(values, y, 5, product=True)
        want = torch.stack([values[y == k].sum(0) for k in range(5)])
        assert by_product.shape == by_add.shape == want.shape
        assert torch.allclose(by_add, want, atol=1e-12) and torch.allclose(by_product, want, atol=1e-12)
        assert float(by_product[3].abs().sum()) == 0.0


def test_fedpac_qp_matrix_is_variance_plus_bias_gram():
    hs = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]], [[1.0, 1.0]]])
    v = torch.tensor([0.5, 0.25, 0.125])
    p = qp_matrix(0, v, hs)
    # rows j: h_0 - h_j = [0,0], [1,-1], [0,-1]
    want = torch.tensor([[0.5, 0.0, 0.0], [0.0, 0.25 + 2.0, 1.0], [0.0, 1.0, 0.125 + 1.0]], dtype=torch.float64)
    assert torch.allclose(p, want)
    a = solve_simplex_qp(p)
    brute = min((float(x @ p @ x), x) for x in (torch.tensor([i / 50, j / 50, (50 - i - j) / 50], dtype=torch.float64)
                                               for i in range(51) for j in range(51 - i)))
    assert float(a @ p @ a) <= brute[0] + 1e-9


def test_fedpac_statistics_and_alignment_on_hand_values():
    model = MLP(2, 2, hidden=2)
    with torch.no_grad():
        params = {"fc1.weight": torch.eye(2), "fc1.bias": torch.zeros(2), "fc2.weight": torch.eye(2),
                  "fc2.bias": torch.zeros(2)}
    x = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0], [0.0, 2.0]])
    y = torch.tensor([0, 0, 1, 1])
    s = feature_statistics(model, params, x, y, 3)
    assert torch.allclose(s["mu"], torch.tensor([[2.0, 0.0], [0.0, 2.0], [0.0, 0.0]]))
    assert torch.allclose(s["h"], 0.5 * s["mu"])
    # V = [sum_k p_k tr E[ff^T|k] - sum_k p_k^2 ||mu_k||^2] / n = [0.5*5 + 0.5*4 - 0.25*4 - 0.25*4] / 4
    assert torch.allclose(s["V"], torch.tensor([0.625]))
    cent, has = aggregate_centroids([s["mu"], torch.tensor([[4.0, 0.0], [9.0, 9.0], [0.0, 0.0]])],
                                    [s["counts"], torch.tensor([2.0, 0.0, 0.0])], "counts")
    assert torch.allclose(cent[0], torch.tensor([3.0, 0.0])) and has.tolist() == [True, True, False]
    batch = Batch(x, y, None, torch.tensor([[1.0, 1.0], [0.0, 2.0], [0.0, 0.0], [0.0, 0.0]]))
    got = alignment_loss({}, batch, cent, has, 2.0, False)
    assert torch.isclose(got, torch.tensor(2.0 * (5.0 + 13.0 + 4.0 + 4.0) / 4))  # mean ||f - c_y||^2, * lambda
    per_entry = alignment_loss({}, batch, cent, has, 2.0, True)  # the authors' MSELoss: also / d
    assert torch.isclose(per_entry, got / 2)


def test_fedpac_without_alignment_and_collaboration_is_fedper_like(tiny_fed):
    """lambda = 0 and own head: the body is FedAvg of the uploads, each client gets its own trained head back."""
    sim = tiny_sim(tiny_fed, "fedpac", {"lam": 0.0, "combine": "local"}, rounds=2)
    sim.run_round()
    msgs = {c: train_message(sim, c) for c in range(4)}
    replies = {c: run_client(sim, c, msgs[c]).reply for c in range(4)}
    before = sim.server
    after = sim.method.aggregate("train", before, replies, sim.sctx(1))
    body = sim.model.body_names()
    want = weighted_average([{n: replies[c].params()[n] for n in body} for c in range(4)],
                            [replies[c].metrics["num_samples"] for c in range(4)])
    assert all(torch.equal(after["global"][n], want[n]) for n in body)
    head = sim.model.head_names()
    assert all(torch.equal(after["heads"][c][n], replies[c].params()[n]) for c in range(4) for n in head)
    qp = tiny_sim(tiny_fed, "fedpac", rounds=2)
    qp.run_round()
    assert "fedpac_self_weight" in qp.history[-1] and 0 < qp.history[-1]["fedpac_self_weight"] <= 1
