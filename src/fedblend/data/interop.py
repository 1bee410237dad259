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
import pickle
import zipfile
from pathlib import Path

import numpy as np
import torch

from fedblend.common.jsonio import read_json_object
from fedblend.data.partition import PartitionError, PartitionFileError, counts_matrix
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


PFLLIB_FIX = ("a PFLlib client file is np.savez_compressed(f, data={'x': samples (N x C x H x W floats), 'y': N "
              "integer labels}); export it again (fedblend partition --export pflib, or PFLlib's generate_*.py)")
# what the pickle of a PFLlib "data" entry may name: numpy arrays and dtypes (any other class is refused, so a
# crafted file cannot run code; np.load(allow_pickle=True) would run it)
_PICKLE_OK = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
              ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
              ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
              ("numpy", "ndarray"), ("numpy", "dtype")}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_OK and not module.startswith("numpy.dtypes"):
            raise pickle.UnpicklingError(f"it names {module}.{name}, which is not numpy data (refused: loading it "
                                         f"could run code)")
        return super().find_class(module, name)


def _load_data_entry(path: Path) -> object:
    """The object PFLlib stored under ``data`` in the ``.npz`` at ``path``, unpickled with numpy classes only."""
    with zipfile.ZipFile(path) as zf:
        if "data.npy" not in zf.namelist():
            raise PartitionFileError(f"{path} has no 'data' entry (it holds {sorted(zf.namelist())}); {PFLLIB_FIX}")
        with zf.open("data.npy") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(f)
            if dtype.hasobject:
                arr = _ArraysOnly(f).load()
            else:
                arr = np.frombuffer(f.read(), dtype=dtype).reshape(shape)
    return arr.tolist() if isinstance(arr, np.ndarray) and arr.dtype.hasobject and arr.shape == () else arr


def read_pflib_client(path: Path) -> dict[str, np.ndarray]:
    """One PFLlib client file as ``{"x": samples, "y": int64 labels}``, checked: a readable ``.npz`` with a
    ``data`` dict holding ``x`` (numbers) and ``y`` (integer labels, one per sample)."""
    try:
        d = _load_data_entry(path)
    except PartitionFileError:
        raise
    except (zipfile.BadZipFile, pickle.UnpicklingError, ValueError, EOFError, OSError, KeyError, TypeError,
            AttributeError, IndexError) as exc:
        raise PartitionFileError(f"{path} is not a readable PFLlib client file ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else 'damaged'}); {PFLLIB_FIX}") from exc
    if not isinstance(d, dict):
        raise PartitionFileError(f"{path}: its 'data' entry is a {type(d).__name__}, not a dict with 'x' and 'y'; "
                                 f"{PFLLIB_FIX}")
    for key in ("x", "y"):
        if key not in d:
            raise PartitionFileError(f"{path}: its 'data' dict has no {key!r} (keys: {sorted(map(str, d))}); "
                                     f"{PFLLIB_FIX}")
    x, y = np.asarray(d["x"]), np.asarray(d["y"])
    if x.dtype.kind not in "fiu" or x.ndim < 1:
        raise PartitionFileError(f"{path}: 'x' must be an array of numbers, one row per sample, got dtype {x.dtype} "
                                 f"and shape {x.shape}; {PFLLIB_FIX}")
    if y.ndim != 1 or y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0)):
        raise PartitionFileError(f"{path}: 'y' must be a 1-D array of integer labels, got dtype {y.dtype} and shape "
                                 f"{y.shape}; {PFLLIB_FIX}")
    if len(x) != len(y):
        raise PartitionFileError(f"{path}: 'x' holds {len(x)} samples but 'y' {len(y)} labels; {PFLLIB_FIX}")
    return {"x": x, "y": y.astype(np.int64)}


def read_pflib(folder: str | Path) -> list[dict[str, dict[str, np.ndarray]]]:
    """Every client of a PFLlib folder: ``[{"train": {"x", "y"}, "test": {"x", "y"}}, ...]`` in client order."""
    root = Path(folder)
    if not (root / "train").is_dir() or not (root / "test").is_dir():
        raise PartitionFileError(f"{root}: not a PFLlib partition folder (needs train/ and test/ with 0.npz, 1.npz, "
                                 f"...)")
    n = len(list((root / "train").glob("*.npz")))
    if n == 0:
        raise PartitionFileError(f"{root}/train holds no .npz files")
    clients = []
    for k in range(n):
        c = {}
        for part in ("train", "test"):
            path = root / part / f"{k}.npz"
            if not path.is_file():
                raise PartitionFileError(f"{path} is missing (PFLlib numbers clients 0..{n - 1}, in train/ and test/)")
            c[part] = read_pflib_client(path)
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
                raise PartitionFileError(f"{where}: sample {j} (label {int(y[j])}) is not in the dataset (or is used "
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
            where = f"{folder}/{part}/{k}.npz"
            n, x = len(c[part]["y"]), c[part]["x"]
            if x.size != n * int(np.prod(tx.shape[1:])):
                raise PartitionFileError(f"{where}: samples of shape {tuple(x.shape[1:])}, but dataset {raw.name!r} has "
                                         f"{tuple(tx.shape[1:])}; is this partition of this dataset?")
            out[part].append(m.take(to_pool(x).reshape((n, *tx.shape[1:])), c[part]["y"], where))
    return out


def load_indices(path: str | Path, raw: RawDataset, split: str) -> dict[str, list[list[int]]]:
    """``partition.path`` for ``partition.kind = "indices"``: a PFLlib folder or a fedblend ``partition.json``."""
    p = Path(path)
    if p.is_dir():
        return import_pflib(p, raw, split)
    if not p.is_file():
        raise PartitionFileError(f"partition.path {p} does not exist (a PFLlib folder or a partition.json)")
    data = read_json_object(p, "partition.path must be a partition.json written by fedblend (`fedblend partition "
                               "--out DIR`, or a run's) or a PFLlib folder")
    spec = data.get("spec", {})
    if not isinstance(spec, dict):
        raise PartitionFileError(f"{p}: \"spec\" must be an object (the partition spec), got {spec!r}")
    if spec.get("split", split) != split:
        raise PartitionFileError(f"{p} was drawn with partition.split = {spec['split']!r}; set the same split "
                                 f"(indices point into that split's pool), got {split!r}")
    if data.get("dataset", raw.name) != raw.name:
        raise PartitionFileError(f"{p} is a partition of dataset {data['dataset']!r}, not {raw.name!r}")
    if "indices" not in data:
        raise PartitionFileError(f"{p} has no \"indices\" (per-client sample indices): not a fedblend partition.json")
    return data["indices"]


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
