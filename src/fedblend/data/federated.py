"""Federated datasets: a partition of a real dataset into per-client train / (val) / test tensors.

Split modes (how each client's evaluation data is made):

* ``official`` (FedAPA, FedALP): the official training split is partitioned; the official test split is divided
  with the same per-class proportions (or ``test_per_client`` samples with the client's class mix).
* ``merge`` (PFLlib / FedALA): train and test are merged, partitioned, then each client's samples are shuffled
  and split ``train_fraction`` / rest (75/25 unless set).
* ``train_val_test`` (pFedRLLA Sec. 5, "65:15:20"): merged, partitioned, each client split ``train_fraction`` /
  ``val_fraction`` / rest (65 / 15 / 20 unless set).

All tensors stay in memory as float32 (images normalised with the dataset's mean/std) or int64 (token ids), so
training slices tensors directly with no per-batch loader overhead.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch

from fedblend.common.errors import ConfigError
from fedblend.common.rng import SeedTree
from fedblend.data.partition import (
    KINDS,
    RULES,
    PartitionError,
    PartitionFileError,
    check_indices,
    counts_matrix,
    draw_domains,
    format_counts,
    partition,
    split_like,
)
from fedblend.data.raw import RawDataset

SPLITS = ("official", "merge", "train_val_test")
# kinds drawn here plus the imported ones: "indices" (a PFLlib folder or a partition.json at partition.path) and
# "flwr" (a flwr-datasets partitioner named in partition.flwr); see fedblend.data.interop
SPEC_KINDS = (*KINDS, "indices", "flwr")


@dataclass
class PartitionSpec:
    """What to partition and how; the fields are the ``[partition]`` table of a run config."""

    CHOICES: ClassVar[dict] = {"kind": SPEC_KINDS, "rule": RULES, "split": SPLITS}
    RANGES: ClassVar[dict] = {"num_clients": "[1, 100000]", "alpha": "> 0", "classes_per_client": "[1, 100000]",
                              "shards_per_client": "[1, 100000]", "samples_per_client": "[1, 1000000000]",
                              "min_samples": "[0, 1000000000]", "min_test_samples": "[0, 1000000000]",
                              "max_tries": "[1, 100000]", "train_fraction": "(0, 1)", "val_fraction": "(0, 1)",
                              "test_per_client": "[1, 1000000000]", "pool_fraction": "(0, 1]",
                              "seed": "[0, 4294967295]"}

    #: ``iid``, ``dirichlet``, ``pathological``, ``shards``, ``one_class``, ``domains`` (every client's data from one
    #: domain of a multi-domain dataset, ``mnist_star``; split ``merge`` or ``train_val_test``); ``indices``: a partition
    #: read from ``path`` (a PFLlib folder or a fedblend ``partition.json``); ``flwr``: a flwr-datasets partitioner
    #: (``flwr``, ``flwr_options``)
    kind: str = "dirichlet"
    #: ``pflib`` or ``fedapa`` flavour of ``dirichlet`` / ``pathological``
    rule: str = "pflib"
    #: number of clients the data is partitioned into
    num_clients: int = 20
    #: Dirichlet concentration (> 0)
    alpha: float = 0.1
    #: kind ``pathological``: classes per client
    classes_per_client: int = 2
    #: kind ``shards``: shards per client
    shards_per_client: int = 2
    #: kind ``one_class``: samples per client
    samples_per_client: int = 500
    #: kind ``pathological``, rule ``pflib``: equal sample counts per client
    balanced: bool = False
    #: redraw until every client has this many training samples (unset: the rule's, PFLlib dir: min(40, N/clients/2);
    #: FedAPA: 129)
    min_samples: int | None = None
    #: official split only: redraw until every client has this many test samples (unset: the rule's; FedAPA: 3)
    min_test_samples: int | None = None
    #: redraws before failing
    max_tries: int = 1000
    #: ``official``, ``merge``, ``train_val_test``
    split: str = "merge"
    #: merge / train_val_test only: training share per client (``train_fraction + val_fraction < 1``; unset: 0.75 for
    #: merge, PFLlib's 75/25, and 0.65 for train_val_test, pFedRLLA's 65/15/20)
    train_fraction: float | None = None
    #: train_val_test only: validation share per client
    val_fraction: float = 0.15
    #: official split only: fixed test samples per client with its class mix (FedALP: 100)
    test_per_client: int | None = None
    #: kind ``domains``: share of the clients per domain, in the dataset's domain order (MNIST*: MNIST, USPS,
    #: mnist-texture; paper App. B.1 test setting)
    domain_shares: tuple[float, ...] = (0.4, 0.4, 0.2)
    #: kind ``indices`` only: a PFLlib partition folder (``train/{k}.npz``, ``test/{k}.npz``; split ``merge``, PFLlib's
    #: own, or ``official``) or a fedblend ``partition.json`` (same split and dataset); ``num_clients`` must equal its
    #: client count
    path: str | None = None
    #: kind ``flwr`` only: a flwr-datasets partitioner class, e.g. ``"DirichletPartitioner"`` (``pip install
    #: 'fedblend[flwr-datasets]'``); it partitions the pool's labels, then the split applies as for the other kinds
    flwr: str | None = None
    #: kind ``flwr`` only: the partitioner's keyword arguments as an inline table, e.g. ``{alpha = 0.1,
    #: min_partition_size = 10}``; ``num_partitions`` (= ``num_clients``), ``partition_by`` (``"label"``) and ``seed``
    #: (the run's seed) are filled in unless given
    flwr_options: dict | None = None
    #: keep a seeded uniform random share of the pool (train + test merged) before the partition is drawn, for cheap runs
    #: on the same data in fedblend and, exported, in PFLlib (docs/validation.md); kinds drawn by fedblend, split
    #: ``merge`` / ``train_val_test`` only
    pool_fraction: float = 1.0
    #: the seed the partition is drawn from (the pool subset, the draw, each client's split); unset: the run's
    #: ``seed``. Set it to train several seeds on one partition (docs/validation-2.md: ``--set seed=S`` with
    #: ``partition.seed = 0`` varies the initial model and the batches, not the clients' data)
    seed: int | None = None

    def __post_init__(self) -> None:
        """An unset ``train_fraction`` is the split's own: 0.65 for ``train_val_test`` (pFedRLLA's 65/15/20 with
        ``val_fraction`` 0.15), 0.75 otherwise (PFLlib's 75/25 for ``merge``; unused by ``official``)."""
        if self.train_fraction is None:
            self.train_fraction = 0.65 if self.split == "train_val_test" else 0.75

    def validate(self, where: str) -> None:
        """The cross-field rules of ``[partition]`` (a ``ConfigError`` naming ``where``)."""
        for kind, name in (("indices", "path"), ("flwr", "flwr")):
            if self.kind == kind and not getattr(self, name):
                raise ConfigError(f"{where}.kind = {kind!r} needs {where}.{name}")
            if self.kind != kind and getattr(self, name) is not None:
                raise ConfigError(f"{where}.{name} applies only to {where}.kind = {kind!r}, got kind {self.kind!r}")
        if self.pool_fraction != 1.0 and (self.kind in ("indices", "flwr", "domains") or self.split == "official"):
            raise ConfigError(f"{where}.pool_fraction subsamples the merged pool before a partition is drawn: it "
                              f"needs a kind drawn by fedblend (not indices / flwr / domains) and split 'merge' or "
                              f"'train_val_test', got kind {self.kind!r}, split {self.split!r}")
        if self.seed is not None and self.kind == "indices":
            raise ConfigError(f"{where}.seed seeds a drawn partition; kind 'indices' reads one from {where}.path")
        if self.flwr_options is not None and self.kind != "flwr":
            raise ConfigError(f"{where}.flwr_options applies only to {where}.kind = 'flwr'")
        if self.split == "train_val_test" and self.train_fraction + self.val_fraction >= 1:
            raise ConfigError(f"{where}.train_fraction + {where}.val_fraction must be < 1 (the rest is the test "
                              f"share), got {self.train_fraction} + {self.val_fraction}")


@dataclass
class ClientData:
    """One client's tensors; ``val_*`` are empty unless the split has a validation part."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    def to(self, device: str | torch.device) -> ClientData:
        """The same client's tensors on ``device`` (moved once per run, never per batch)."""
        return ClientData(**{k: v.to(device) for k, v in vars(self).items()})


@dataclass
class FederatedData:
    clients: list[ClientData]
    info: dict
    # indices into the pool ("train" for official, merged train+test otherwise), per client and part
    indices: dict[str, list[list[int]]] = field(default_factory=dict)
    spec: PartitionSpec = field(default_factory=PartitionSpec)
    counts: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def to(self, device: str | torch.device) -> FederatedData:
        """The same federation with every client's tensors on ``device`` (``self`` when already there)."""
        if all(c.train_x.device == torch.device(device) for c in self.clients):
            return self
        return FederatedData([c.to(device) for c in self.clients], self.info, self.indices, self.spec, self.counts)

    def table(self) -> str:
        return format_counts(self.counts["train"], self.counts.get("test"))

    def summary(self) -> dict:
        return {
            "dataset": self.info["name"],
            "spec": asdict(self.spec),
            "num_clients": self.num_clients,
            "train_counts": self.counts["train"].tolist(),
            "test_counts": self.counts["test"].tolist(),
            "val_counts": self.counts["val"].tolist() if "val" in self.counts else None,
        }

    def save(self, path: str | Path) -> None:
        """Write the partition (indices + counts + spec) as JSON; :func:`load_partition` reads it back."""
        from fedblend.common.files import write_atomic

        write_atomic(path, json.dumps({**self.summary(), "indices": self.indices}).encode())


def _normalise(raw: RawDataset, x: np.ndarray) -> torch.Tensor:
    if raw.kind == "text":
        return torch.from_numpy(np.array(x, dtype=np.int64))
    t = torch.from_numpy(np.array(x, dtype=np.float32)).div_(255.0)
    mean = torch.tensor(raw.mean).view(1, -1, 1, 1)
    std = torch.tensor(raw.std).view(1, -1, 1, 1)
    return (t - mean) / std


def dataset_info(raw: RawDataset) -> dict:
    info = {"name": raw.name, "kind": raw.kind, "num_classes": raw.num_classes,
            "input_shape": tuple(raw.test_x.shape[1:])}
    if raw.kind == "image":
        info.update(in_channels=int(raw.test_x.shape[1]), image_size=int(raw.test_x.shape[-1]))
    info.update(raw.extra)
    return info


def build_federated(raw: RawDataset, spec: PartitionSpec, seed: int,
                    indices: dict[str, list[list[int]]] | None = None, source: str = "indices") -> FederatedData:
    """Partition ``raw`` per ``spec`` with randomness from ``seed``, the run's, or ``spec.seed`` where set (or
    reuse saved ``indices``, read from ``source``: they are checked first,
    :func:`~fedblend.data.partition.check_indices`)."""
    if spec.split not in SPLITS:
        raise ValueError(f"partition.split must be one of {list(SPLITS)}, got {spec.split!r}")
    tree = SeedTree(seed if spec.seed is None else spec.seed).child("partition")
    if spec.split == "official":
        pool_x, pool_y = raw.train_x, raw.train_y
    else:
        pool_x = np.concatenate([raw.train_x, raw.test_x]) if len(raw.train_x) else raw.test_x
        pool_y = np.concatenate([raw.train_y, raw.test_y]) if len(raw.train_y) else raw.test_y
    official = spec.split == "official"
    pools = {"train": len(pool_y), "val": len(pool_y), "test": len(raw.test_y) if official else len(pool_y)}
    if indices is not None:
        check_indices(indices, pools, official, source)
    else:
        indices = _draw_indices(raw, spec, pool_y, tree, pools)
    px = _normalise(raw, pool_x)
    py = torch.from_numpy(pool_y).long()
    tx = _normalise(raw, raw.test_x) if spec.split == "official" else px
    ty = torch.from_numpy(raw.test_y).long() if spec.split == "official" else py
    empty_x, empty_y = px[:0], py[:0]
    clients = []
    for k in range(len(indices["train"])):
        tr = torch.as_tensor(indices["train"][k], dtype=torch.long)
        te = torch.as_tensor(indices["test"][k], dtype=torch.long)
        va = torch.as_tensor(indices["val"][k], dtype=torch.long) if "val" in indices else None
        clients.append(ClientData(px[tr], py[tr], tx[te], ty[te],
                                  px[va] if va is not None else empty_x, py[va] if va is not None else empty_y))
    test_labels = raw.test_y if spec.split == "official" else pool_y
    counts = {"train": counts_matrix([np.asarray(i, dtype=np.int64) for i in indices["train"]], pool_y, raw.num_classes),
              "test": counts_matrix([np.asarray(i, dtype=np.int64) for i in indices["test"]], test_labels, raw.num_classes)}
    if "val" in indices:
        counts["val"] = counts_matrix([np.asarray(i, dtype=np.int64) for i in indices["val"]], pool_y, raw.num_classes)
    return FederatedData(clients, dataset_info(raw), indices, spec, counts)


def _draw_indices(raw: RawDataset, spec: PartitionSpec, pool_y: np.ndarray, tree: SeedTree,
                  pools: dict[str, int]) -> dict:
    official = spec.split == "official"
    fedapa_rule = spec.rule == "fedapa" and spec.kind in ("dirichlet", "pathological")
    min_test = spec.min_test_samples if spec.min_test_samples is not None else (3 if fedapa_rule else 1)
    want_joint_test = official and spec.test_per_client is None
    if spec.kind == "indices":
        from fedblend.data.interop import load_indices

        got = load_indices(spec.path, raw, spec.split)
        if not Path(spec.path).is_dir():  # a partition.json (a PFLlib folder's samples are matched one by one)
            check_indices(got, pools, official, str(spec.path))
        if len(got["train"]) != spec.num_clients:
            raise PartitionFileError(f"partition.path {spec.path} has {len(got['train'])} clients; set "
                                     f"partition.num_clients = {len(got['train'])}")
        return got
    if spec.kind == "flwr":
        from fedblend.data.interop import flwr_indices

        train_parts, test_parts = flwr_indices(pool_y, spec.num_clients, spec.flwr, spec.flwr_options or {},
                                               tree.seed), None
    elif spec.kind == "domains":
        train_parts, test_parts = _domain_parts(raw, spec, tree), None
    else:
        keep = None
        if spec.pool_fraction < 1.0:  # a seeded uniform subset of the pool, then the partition is drawn on it
            size = max(spec.num_clients, int(round(spec.pool_fraction * len(pool_y))))
            keep = np.sort(tree.numpy("pool-subsample").choice(len(pool_y), size=size, replace=False))
            pool_y = pool_y[keep]
        train_parts, test_parts = partition(
            pool_y, spec.num_clients, spec.kind, lambda a: tree.numpy("draw", a), num_classes=raw.num_classes,
            rule=spec.rule, alpha=spec.alpha, classes_per_client=spec.classes_per_client,
            shards_per_client=spec.shards_per_client, samples_per_client=spec.samples_per_client,
            balanced=spec.balanced, min_samples=spec.min_samples, max_tries=spec.max_tries,
            test_labels=raw.test_y if want_joint_test else None, min_test_samples=min_test if official else 0)
        if keep is not None:  # back to indices into the whole pool
            train_parts = [keep[np.asarray(p, dtype=np.int64)] for p in train_parts]
    if official:
        if test_parts is None:
            test_parts = split_like(train_parts, raw.train_y, raw.test_y, tree.numpy("test"), raw.num_classes,
                                    per_client=spec.test_per_client)
        return {"train": [p.tolist() for p in train_parts], "test": [p.tolist() for p in test_parts]}
    return _split_clients(train_parts, spec, tree)


def _split_clients(train_parts: list, spec: PartitionSpec, tree: SeedTree) -> dict[str, list[list[int]]]:
    """Each client's samples of the pool split into its train (val) and test samples by ``train_fraction``
    (``val_fraction``), from the client's own seeded permutation."""
    if spec.split == "merge":
        fracs = (spec.train_fraction,)
    else:
        fracs = (spec.train_fraction, spec.val_fraction)
    if not 0 < sum(fracs) < 1:
        raise ValueError(f"partition.train_fraction (+ val_fraction) must be in (0, 1), got {fracs}")
    out: dict[str, list[list[int]]] = {"train": [], "test": []}
    if spec.split == "train_val_test":
        out["val"] = []
    for k, part in enumerate(train_parts):
        perm = tree.numpy("client-split", k).permutation(part)
        n_train = int(round(fracs[0] * len(perm)))
        out["train"].append(sorted(perm[:n_train].tolist()))
        if spec.split == "train_val_test":
            n_val = int(round(fracs[1] * len(perm)))
            out["val"].append(sorted(perm[n_train : n_train + n_val].tolist()))
            out["test"].append(sorted(perm[n_train + n_val :].tolist()))
        else:
            out["test"].append(sorted(perm[n_train:].tolist()))
    return out


def _domain_parts(raw: RawDataset, spec: PartitionSpec, tree: SeedTree) -> list[np.ndarray]:
    if raw.train_domain is None or raw.test_domain is None:
        raise PartitionError(f"partition.kind = 'domains' needs a dataset made of several domains (mnist_star), "
                             f"not {raw.name!r}")
    if spec.split == "official":
        raise PartitionError("partition.kind = 'domains' needs split = 'merge' or 'train_val_test'")
    pool = np.concatenate([raw.train_domain, raw.test_domain])
    return draw_domains(pool, spec.num_clients, tree.numpy("draw", 0), spec.domain_shares)


def load_partition(path: str | Path) -> tuple[dict, PartitionSpec]:
    """Read a partition written by :meth:`FederatedData.save`: ``(indices, spec)``; :class:`PartitionFileError`
    names the file and what is wrong (the indices are checked against the data by :func:`build_federated`)."""
    from fedblend.common.errors import UserFileError
    from fedblend.common.jsonio import read_json_object

    fix = "it is the run's partition (written by fedblend): restore it, or start the run again with --force"
    try:
        data = read_json_object(path, fix)
    except UserFileError as exc:
        raise PartitionFileError(str(exc)) from exc
    if "indices" not in data or not isinstance(data.get("spec"), dict):
        raise PartitionFileError(f"{path} has no \"indices\" or \"spec\": not a fedblend partition.json; {fix}")
    try:
        spec = PartitionSpec(**data["spec"])
    except TypeError as exc:
        raise PartitionFileError(f"{path}: its \"spec\" is not a partition spec ({exc}); {fix}") from exc
    return data["indices"], spec
