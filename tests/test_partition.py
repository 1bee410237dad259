import numpy as np
import pytest

from fedblend.data.partition import (
    PartitionError,
    assign_by_proportions,
    counts_matrix,
    partition,
    split_like,
)

C = 10
LABELS = np.repeat(np.arange(C), 300)  # 3000 samples, 300 per class
TEST = np.repeat(np.arange(C), 50)


def rngs(seed=0):
    return lambda a: np.random.default_rng([seed, a])


def draw(kind, n=20, seed=0, **kw):
    return partition(LABELS, n, kind, rngs(seed), num_classes=C, **kw)


def _check_disjoint_cover(parts, total, full=True):
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "clients share samples"
    if full:
        assert len(allidx) == total


@pytest.mark.parametrize("kind,kw", [
    ("iid", {}), ("dirichlet", {"alpha": 0.1}), ("dirichlet", {"alpha": 0.5, "rule": "fedapa", "min_samples": 20}),
    ("pathological", {}), ("pathological", {"rule": "fedapa", "min_samples": 20}), ("shards", {}),
    ("one_class", {"samples_per_client": 100}),
])
def test_determinism_by_seed(kind, kw):
    a, _ = draw(kind, **kw)
    b, _ = draw(kind, **kw)
    c, _ = draw(kind, seed=1, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_sizes_and_classes():
    parts, _ = draw("iid")
    _check_disjoint_cover(parts, len(LABELS))
    assert {len(p) for p in parts} == {150}
    counts = counts_matrix(parts, LABELS, C)
    assert (counts > 0).sum(1).min() >= 8  # iid clients see nearly every class


def test_dirichlet_pflib_min_size_and_cover():
    parts, _ = draw("dirichlet", alpha=0.1)
    _check_disjoint_cover(parts, len(LABELS))
    assert min(len(p) for p in parts) >= min(40, len(LABELS) / 20 / 2)
    counts = counts_matrix(parts, LABELS, C)
    assert np.median((counts > 0).sum(1)) <= 5  # alpha 0.1: few classes per client


def test_dirichlet_fedapa_rule_and_test_split_follow_same_proportions():
    train, test = draw("dirichlet", alpha=0.5, rule="fedapa", min_samples=20, test_labels=TEST,
                       min_test_samples=3)
    _check_disjoint_cover(train, len(LABELS), full=False)
    _check_disjoint_cover(test, len(TEST), full=False)
    assert min(len(p) for p in train) >= 20 and min(len(p) for p in test) >= 3
    tr = counts_matrix(train, LABELS, C) / 300
    te = counts_matrix(test, TEST, C) / 50
    assert np.abs(tr - te).max() < 0.03  # both are int(P * n_c): same proportions up to rounding


def test_pathological_pflib_two_classes_each():
    parts, _ = draw("pathological", classes_per_client=2)
    _check_disjoint_cover(parts, len(LABELS))
    counts = counts_matrix(parts, LABELS, C)
    assert ((counts > 0).sum(1) == 2).all()


def test_pathological_fedapa_fixed_blocks():
    parts, _ = draw("pathological", rule="fedapa", classes_per_client=2, min_samples=20)
    counts = counts_matrix(parts, LABELS, C)
    assert ((counts > 0).sum(1) == 2).all()
    # fixed blocks: clients 0-3 hold classes {0, 1}, clients 4-7 hold {2, 3}, ...
    for k in range(20):
        block = 2 * (k // 4)
        assert set(np.flatnonzero(counts[k])) == {block, block + 1}
    # shares are U(0.3, 0.7) normalised over 4 clients: each client gets between 0.3/2.5 and 0.7/1.9 of a class
    share = counts[:4, 0] / 300
    assert (share > 0.3 / 2.5 - 0.01).all() and (share < 0.7 / 1.9 + 0.01).all()


def test_shards_two_shards_per_client():
    parts, _ = draw("shards", shards_per_client=2)
    _check_disjoint_cover(parts, len(LABELS))
    counts = counts_matrix(parts, LABELS, C)
    assert ((counts > 0).sum(1) <= 4).all()  # a shard may straddle one class boundary
    assert {len(p) for p in parts} == {150}


def test_one_class_blocks():
    parts, _ = draw("one_class", n=20, samples_per_client=100)
    counts = counts_matrix(parts, LABELS, C)
    for k in range(20):
        assert counts[k, k * C // 20] == 100 and counts[k].sum() == 100
    _check_disjoint_cover(parts, 2000, full=False)


def test_split_like_per_client_count_keeps_class_mix():
    parts, _ = draw("one_class", n=20, samples_per_client=100)
    test = split_like(parts, LABELS, TEST, np.random.default_rng(0), C, per_client=30)
    counts = counts_matrix(test, TEST, C)
    for k in range(20):
        assert counts[k, k * C // 20] == 30 and counts[k].sum() == 30


def test_assign_by_proportions_counts():
    props = np.zeros((C, 2))
    props[:, 0], props[:, 1] = 0.25, 0.5
    parts = assign_by_proportions(LABELS, props, np.random.default_rng(0))
    assert counts_matrix(parts, LABELS, C).tolist() == [[75] * C, [150] * C]


@pytest.mark.parametrize("kw,field", [
    ({"kind": "dirichlet", "alpha": 0.0}, "alpha"),
    ({"kind": "dirichlet", "alpha": -1.0}, "alpha"),
    ({"kind": "iid", "n": 5000}, "num_clients"),
    ({"kind": "pathological", "classes_per_client": 11}, "classes_per_client"),
    ({"kind": "one_class", "samples_per_client": 1000}, "samples_per_client"),
    ({"kind": "iid", "min_samples": 200}, "min_samples"),
    ({"kind": "voronoi"}, "partition.kind"),
])
def test_errors_name_the_parameter(kw, field):
    kw = dict(kw)
    kind, n = kw.pop("kind"), kw.pop("n", 20)
    with pytest.raises(PartitionError, match=field):
        draw(kind, n=n, **kw)


def test_min_size_unreachable_after_redraws_says_how_to_fix():
    with pytest.raises(PartitionError, match=r"in 5 draws.*raise partition.alpha"):
        draw("dirichlet", alpha=0.01, rule="fedapa", min_samples=140, max_tries=5)


def test_domains_partition_gives_each_client_one_domain():
    from fedblend.data.partition import PartitionError, draw_domains

    domains = np.repeat([0, 1, 2], [500, 300, 200])
    parts = draw_domains(domains, 10, np.random.default_rng(0), (0.4, 0.4, 0.2))
    assert len(parts) == 10 and sorted(np.concatenate(parts).tolist()) == list(range(1000))  # every sample once
    owners = [set(domains[p].tolist()) for p in parts]
    assert all(len(o) == 1 for o in owners)
    assert [o.pop() for o in owners] == [0] * 4 + [1] * 4 + [2] * 2  # 40 / 40 / 20 % of the clients
    assert [len(p) for p in parts[:4]] == [125] * 4 and [len(p) for p in parts[8:]] == [100, 100]
    with pytest.raises(PartitionError, match="one per domain"):
        draw_domains(domains, 10, np.random.default_rng(0), (0.5, 0.5))


def test_mnist_star_domains(real_data_dir):
    pytest.importorskip("h5py")
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.sources import load_dataset

    raw = load_dataset("mnist_star", real_data_dir)
    assert raw.train_x.shape[1:] == (3, 28, 28) and np.bincount(raw.train_domain).tolist() == [30000, 7291, 30000]
    fed = build_federated(raw, PartitionSpec(kind="domains", num_clients=10, split="train_val_test"), 0)
    pool = np.concatenate([raw.train_domain, raw.test_domain])
    assert [set(pool[i].tolist()) for i in fed.indices["train"]] == [{0}] * 4 + [{1}] * 4 + [{2}] * 2
    assert fed.info["domain_names"] == ("mnist", "usps", "mnist-texture")


@pytest.mark.parametrize("split,given,shares", [
    ("train_val_test", {}, (0.65, 0.15, 0.20)),  # pFedRLLA Sec. 5: 65:15:20
    ("merge", {}, (0.75, 0.0, 0.25)),  # PFLlib's 75/25
    ("train_val_test", {"train_fraction": 0.75}, (0.75, 0.15, 0.10)),  # an explicit share is kept
])
def test_each_split_has_its_own_train_share_unless_one_is_given(split, given, shares):
    """An unset ``train_fraction`` is the split's own share (issue #25: the T4 configs had 75/15/10 with one default
    for every split)."""
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.synthetic import make_synthetic

    spec = PartitionSpec(kind="iid", num_clients=4, split=split, **given)
    fed = build_federated(make_synthetic(), spec, seed=0)
    sizes = {k: sum(len(p) for p in fed.indices.get(k, [])) for k in ("train", "val", "test")}
    total = sum(sizes.values())
    assert (sizes["train"] / total, sizes["val"] / total, sizes["test"] / total) == pytest.approx(shares, abs=0.01)
