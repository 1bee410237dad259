"""Partitions in the peers' formats: PFLlib's npz folders, fedblend's ``partition.json``, flwr-datasets.

**PFLlib** (TsingZ0/PFLlib, ``dataset/<NAME>/``) stores a partition as data, not indices::

    train/{k}.npz, test/{k}.npz   np.savez_compressed(..., data={"x": float32 N x C x H x W, "y": int64 N})
    config.json                   num_clients, non_iid, balance, partition, alpha, batch_size and
                                  "Size of samples for labels in clients": per client [[label, count], ...]

with images as PFLlib's torchvision pipeline makes them: ``ToTensor()`` (x / 255) then ``Normalize(0.5, 0.5)``.
:func:`export_pflib` writes that layout from a fedblend partition; :func:`import_pflib` maps a PFLlib folder
back to indices into fedblend's pool by matching every sample (its uint8 image, recovered exactly from the
float, and its label) to the dataset, so ``partition.kind = "indices"`` runs the very same split. Identical
duplicates in the pool (same pixels and label) are interchangeable; they are assigned in index order.

**flwr-datasets** (Flower): :func:`flwr_indices` gives the pool's labels to a flwr-datasets partitioner named
in ``partition.flwr`` (``"DirichletPartitioner"``, ...) with the options of ``partition.flwr_options`` and
reads back which rows each partition got; needs ``pip install 'fedblend[flwr-datasets]'``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from fedblend.data.partition import PartitionError, counts_matrix
from fedblend.data.raw import RawDataset

PFLLIB_MEAN = PFLLIB_STD = 0.5


def _pflib_x(x: np.ndarray, kind: str) -> np.ndarray:
    """Samples as PFLlib stores them: ToTensor (x / 255, float32) then Normalize(0.5, 0.5); text as is."""
    if kind == "text":
        return np.asarray(x, dtype=np.int64)
    t = torch.from_numpy(np.ascontiguousarray(x)).float().div(255)
    return t.sub_(PFLLIB_MEAN).div_(PFLLIB_STD).numpy()


def _uint8_x(x: np.ndarray) -> np.ndarray:
    """The uint8 image a PFLlib float image came from (exact: the 256 levels are far apart in float32)."""
    return np.rint((np.asarray(x, dtype=np.float64) * PFLLIB_STD + PFLLIB_MEAN) * 255).clip(0, 255).astype(np.uint8)


def _pools(raw: RawDataset, split: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train pool, test pool) that fedblend's indices point into for ``split`` (see ``build_federated``)."""
    if split == "official":
        return (raw.train_x, raw.train_y), (raw.test_x, raw.test_y)
    x = np.concatenate([raw.train_x, raw.test_x]) if len(raw.train_x) else raw.test_x
    y = np.concatenate([raw.train_y, raw.test_y]) if len(raw.train_y) else raw.test_y
    return (x, y), (x, y)


def export_pflib(raw: RawDataset, indices: dict[str, list[list[int]]], split: str, out_dir: str | Path,
                 meta: dict | None = None) -> Path:
    """Write a fedblend partition (``indices`` into ``raw`` under ``split``) in PFLlib's layout; returns
    ``out_dir``. A validation part (split ``train_val_test``) has no place in PFLlib's layout and is refused."""
    if "val" in indices:
        raise PartitionError("PFLlib's layout has train and test only; export a partition without validation "
                             "data (partition.split = 'merge' or 'official')")
    out = Path(out_dir)
    (out_tr, out_te) = (out / "train", out / "test")
    out_tr.mkdir(parents=True, exist_ok=True)
    out_te.mkdir(parents=True, exist_ok=True)
    (tx, ty), (ex, ey) = _pools(raw, split)
    sizes = []
    for k, (tr, te) in enumerate(zip(indices["train"], indices["test"])):
        tr, te = np.asarray(tr, dtype=np.int64), np.asarray(te, dtype=np.int64)
        for folder, xs, ys, idx in ((out_tr, tx, ty, tr), (out_te, ex, ey, te)):
            with open(folder / f"{k}.npz", "wb") as f:
                np.savez_compressed(f, data={"x": _pflib_x(xs[idx], raw.kind), "y": ys[idx].astype(np.int64)})
        labels = np.concatenate([ty[tr], ey[te]])
        sizes.append([[int(c), int((labels == c).sum())] for c in np.unique(labels)])
    config = {"num_clients": len(indices["train"]), "non_iid": True, "balance": False, "partition": "fedblend",
              **(meta or {}), "Size of samples for labels in clients": sizes}
    (out / "config.json").write_text(json.dumps(config))
    return out


def read_pflib(folder: str | Path) -> list[dict[str, dict[str, np.ndarray]]]:
    """Every client of a PFLlib folder: ``[{"train": {"x", "y"}, "test": {"x", "y"}}, ...]`` in client order."""
    root = Path(folder)
    if not (root / "train").is_dir() or not (root / "test").is_dir():
        raise PartitionError(f"{root}: not a PFLlib partition folder (needs train/ and test/ with 0.npz, 1.npz, ...)")
    n = len(list((root / "train").glob("*.npz")))
    if n == 0:
        raise PartitionError(f"{root}/train holds no .npz files")
    clients = []
    for k in range(n):
        c = {}
        for part in ("train", "test"):
            path = root / part / f"{k}.npz"
            if not path.exists():
                raise PartitionError(f"{path} is missing (PFLlib numbers clients 0..{n - 1})")
            try:
                with np.load(path, allow_pickle=True) as z:  # PFLlib pickles a dict under "data"
                    d = z["data"].tolist()
                c[part] = {"x": np.asarray(d["x"]), "y": np.asarray(d["y"]).astype(np.int64)}
            except Exception as exc:  # any unreadable file: one line naming it
                raise PartitionError(f"{path}: not a PFLlib client file (an .npz holding data = {{'x', 'y'}}; "
                                     f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        clients.append(c)
    return clients


class _Matcher:
    """Sample -> pool index by exact content (image bytes + label); duplicates handed out in index order."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.free: dict[bytes, list[int]] = {}
        flat = np.ascontiguousarray(x).reshape(len(x), -1)
        for i in range(len(x) - 1, -1, -1):  # reversed, so pop() yields the lowest index first
            self.free.setdefault(flat[i].tobytes() + int(y[i]).to_bytes(8, "little"), []).append(i)

    def take(self, x: np.ndarray, y: np.ndarray, where: str) -> list[int]:
        flat = np.ascontiguousarray(x).reshape(len(x), -1)
        out = []
        for j in range(len(x)):
            slot = self.free.get(flat[j].tobytes() + int(y[j]).to_bytes(8, "little"))
            if not slot:
                raise PartitionError(f"{where}: sample {j} (label {int(y[j])}) is not in the dataset (or is used "
                                     f"twice); is this partition of this dataset, with PFLlib's 0.5 / 0.5 "
                                     f"normalisation?")
            out.append(slot.pop())
        return sorted(out)


def import_pflib(folder: str | Path, raw: RawDataset, split: str) -> dict[str, list[list[int]]]:
    """The indices into ``raw``'s pool (``split`` ``merge``: train + test merged, as PFLlib draws; ``official``:
    train files in the training split, test files in the test split) of every sample of a PFLlib folder."""
    if split not in ("merge", "official"):
        raise PartitionError("a PFLlib partition has train and test parts only: use partition.split = 'merge' "
                             "(PFLlib's own: train and test merged) or 'official'")
    clients = read_pflib(folder)
    (tx, ty), (ex, ey) = _pools(raw, split)
    to_pool = (lambda v: v) if raw.kind == "text" else _uint8_x
    train_m = _Matcher(tx, ty)
    test_m = train_m if split == "merge" else _Matcher(ex, ey)
    out: dict[str, list[list[int]]] = {"train": [], "test": []}
    for k, c in enumerate(clients):
        for part, m in (("train", train_m), ("test", test_m)):
            x = to_pool(c[part]["x"]).reshape((len(c[part]["y"]), *tx.shape[1:]))
            out[part].append(m.take(x, c[part]["y"], f"{folder}/{part}/{k}.npz"))
    return out


def load_indices(path: str | Path, raw: RawDataset, split: str) -> dict[str, list[list[int]]]:
    """``partition.path`` for ``partition.kind = "indices"``: a PFLlib folder or a fedblend ``partition.json``."""
    p = Path(path)
    if p.is_dir():
        return import_pflib(p, raw, split)
    if not p.is_file():
        raise PartitionError(f"partition.path {p} does not exist (a PFLlib folder or a partition.json)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PartitionError(f"partition.path {p} is not a fedblend partition.json ({' '.join(str(exc).split())})"
                             ) from None
    spec = data.get("spec", {}) if isinstance(data, dict) else None
    if not isinstance(spec, dict):
        raise PartitionError(f"partition.path {p} is not a fedblend partition.json (no spec / indices)")
    if spec.get("split", split) != split:
        raise PartitionError(f"{p} was drawn with partition.split = {spec['split']!r}; set the same split "
                             f"(indices point into that split's pool), got {split!r}")
    if data.get("dataset", raw.name) != raw.name:
        raise PartitionError(f"{p} is a partition of dataset {data['dataset']!r}, not {raw.name!r}")
    pool = len(raw.train_y) + len(raw.test_y)
    sizes = {"train": len(raw.train_y), "test": len(raw.test_y)} if split == "official" else {"train": pool,
                                                                                              "test": pool}
    return checked_indices(data.get("indices"), {**sizes, "val": sizes["train"]}, str(p))


def checked_indices(indices: object, sizes: dict[str, int], where: str) -> dict[str, list[list[int]]]:
    """``indices`` (``{"train": [[i, ...] per client], "test": ..., optional "val"}``) if it is one: lists of
    integers within each part's pool (``sizes``), the same number of clients in every part; else a
    :class:`PartitionError` naming ``where``."""
    def bad(why: str) -> PartitionError:
        return PartitionError(f"{where}: not a usable partition ({why})")

    if not isinstance(indices, dict) or not {"train", "test"} <= set(indices) or set(indices) - {"train", "test", "val"}:
        raise bad("indices must hold 'train' and 'test' (and optionally 'val') lists, one per client")
    counts = set()
    for part, clients in indices.items():
        if not isinstance(clients, list) or not clients:
            raise bad(f"indices.{part} must be a non-empty list of per-client lists")
        counts.add(len(clients))
        for k, rows in enumerate(clients):
            if not isinstance(rows, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in rows):
                raise bad(f"indices.{part}[{k}] must be a list of integers")
            if rows and not (0 <= min(rows) and max(rows) < sizes[part]):
                raise bad(f"indices.{part}[{k}] points outside the {sizes[part]} samples of the {part} pool")
    if len(counts) != 1:
        raise bad("the parts list different numbers of clients")
    return indices  # type: ignore[return-value]


def flwr_indices(labels: np.ndarray, num_clients: int, name: str, options: dict, seed: int) -> list[np.ndarray]:
    """The rows of ``labels`` each of ``num_clients`` partitions of flwr-datasets' partitioner ``name`` gets
    (with ``options``; ``num_partitions`` = num_clients, ``partition_by`` = "label" and ``seed`` filled in where the
    partitioner takes them)."""
    try:
        import inspect

        import datasets
        from flwr_datasets import partitioner as fp
    except ImportError as exc:
        raise PartitionError("partition.kind = 'flwr' needs flwr-datasets: pip install 'fedblend[flwr-datasets]'") from exc
    cls = getattr(fp, name, None)
    if cls is None or not isinstance(cls, type):
        names = sorted(n for n in dir(fp) if n.endswith("Partitioner") and n != "Partitioner")
        raise PartitionError(f"partition.flwr = {name!r} is not a flwr-datasets partitioner; one of {names}")
    params = inspect.signature(cls).parameters
    kwargs = dict(options)
    for key, value in (("num_partitions", num_clients), ("partition_by", "label"), ("seed", seed)):
        if key in params and key not in kwargs:
            kwargs[key] = value
    try:
        part = cls(**kwargs)
        part.dataset = datasets.Dataset.from_dict({"label": labels.astype(np.int64), "row": np.arange(len(labels))})
        return [np.sort(np.asarray(part.load_partition(k)["row"], dtype=np.int64)) for k in range(num_clients)]
    except (TypeError, ValueError) as exc:
        raise PartitionError(f"flwr-datasets {name}({kwargs}): {exc}") from exc


def class_counts(indices: dict[str, list[list[int]]], raw: RawDataset, split: str) -> dict[str, np.ndarray]:
    """Per-client class counts of each part (train / test) of ``indices``."""
    (_, ty), (_, ey) = _pools(raw, split)
    return {part: counts_matrix([np.asarray(i, dtype=np.int64) for i in indices[part]], ty if part == "train" else ey,
                                raw.num_classes) for part in ("train", "test")}
