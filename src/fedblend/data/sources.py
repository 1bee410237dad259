"""Dataset sources: read the canonical archives from a data directory, verifying md5.

The data directory is, in order: an explicit argument (the CLI's ``--data-dir``), the ``FEDBLEND_DATA``
environment variable, or ``~/.fedblend/data``. Files live in one sub-folder per dataset, with their canonical
names (the layout of ``shared/data``)::

    mnist/train-images-idx3-ubyte.gz ...      fashion-mnist/...      ag_news/test.csv.gz
    usps/usps.h5                              cifar-10/cifar-10-python.tar.gz

A missing file is downloaded from its canonical URL; if that fails the error names the file, where it was
looked for and where to get it. A file whose md5 differs raises :class:`ChecksumError` - never a silently wrong
result.

Where files are and how they are fetched: :mod:`fedblend.data.fetch`; the archive formats:
:mod:`fedblend.data.readers`; this module has each dataset's loader and the registry.
"""

from __future__ import annotations

import csv
import gzip
import os
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fedblend.common import plugins
from fedblend.common.errors import DataError, FedblendError
from fedblend.common.guard import plugin_guard
from fedblend.common.optional import require
from fedblend.data.fetch import (  # noqa: F401 - imported from here too
    ENV_VAR,
    ChecksumError,
    DataNotFoundError,
    FileSpec,
    download_verified,
    fetch,
    md5sum,
    resolve_data_dir,
)
from fedblend.data.raw import RawDataset
from fedblend.data.readers import (  # noqa: F401 - imported from here too
    encode_texts,
    read_cifar_tarball,
    read_idx,
    read_libsvm,
    tokenize,
)
from fedblend.data.synthetic import SIZES as SYNTHETIC
from fedblend.data.synthetic import make_synthetic

_LECUN = "https://ossci-datasets.s3.amazonaws.com/mnist/"
_ZALANDO = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
_MNIST_FILES = {
    "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
}
_FMNIST_FILES = {
    "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
    "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
    "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
    "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
}


def _load_idx_dataset(name: str, folder: str, files: dict[str, str], base_url: str):
    def load(data_dir: Path, download: bool = True) -> RawDataset:
        p = {k: fetch(data_dir, folder, FileSpec(k, md5, base_url + k), download) for k, md5 in files.items()}
        return RawDataset(
            name=name,
            train_x=read_idx(p["train-images-idx3-ubyte.gz"])[:, None],
            train_y=read_idx(p["train-labels-idx1-ubyte.gz"]).astype(np.int64),
            test_x=read_idx(p["t10k-images-idx3-ubyte.gz"])[:, None],
            test_y=read_idx(p["t10k-labels-idx1-ubyte.gz"]).astype(np.int64),
            num_classes=10,
        )

    return load


def _load_cifar(variant: str) -> Callable[..., RawDataset]:
    spec = {
        "cifar10": FileSpec("cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
                            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"),
        "cifar100": FileSpec("cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
                             "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
    }[variant]
    folder = {"cifar10": "cifar-10", "cifar100": "cifar-100"}[variant]

    def load(data_dir: Path, download: bool = True) -> RawDataset:
        trx, tr_y, tex, te_y = read_cifar_tarball(fetch(data_dir, folder, spec, download), variant)
        return RawDataset(variant, trx, tr_y, tex, te_y, 10 if variant == "cifar10" else 100,
                          mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))

    return load


def _load_ag_news(data_dir: Path, download: bool = True) -> RawDataset:
    """AG News. Only the canonical test split (7,600 rows) exists in this workspace: it is the whole dataset
    here, and the ``merge``/``train_val_test`` splits divide it per client. ``train.csv`` is used when present."""
    base = "https://raw.githubusercontent.com/mhjabreel/CharCnn_Keras/master/data/ag_news_csv/"
    test = fetch(data_dir, "ag_news", FileSpec("test.csv.gz", "43738251f0b17d2346d0a2c38262cf02", None), download)
    rows = _read_ag_csv(test)
    train_rows: list[tuple[int, str]] = []
    train_path = data_dir / "ag_news" / "train.csv"
    if train_path.exists():
        train_rows = _read_ag_csv(fetch(data_dir, "ag_news", FileSpec(
            "train.csv", "b1a00f826fdfbd249f79597b59e1dc12", base + "train.csv"), download))
    ids, vocab = encode_texts([t for _, t in train_rows + rows])
    labels = np.asarray([c for c, _ in train_rows + rows], dtype=np.int64)
    n = len(train_rows)
    return RawDataset("ag_news", ids[:n], labels[:n], ids[n:], labels[n:], 4, kind="text",
                      extra={"vocab_size": len(vocab) + 2})


def _read_ag_csv(path: Path) -> list[tuple[int, str]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        return [(int(r[0]) - 1, r[1] + " " + r[2]) for r in csv.reader(f) if r]


def _load_usps(data_dir: Path, download: bool = True) -> RawDataset:
    """USPS 16x16 digits from the Kaggle ``usps.h5`` (train 7,291 / test 2,007; needs ``h5py``)."""
    h5py = require_packages("usps")["h5py"]
    path = fetch(data_dir, "usps", FileSpec("usps.h5", "355df6b942eb766252e0340bc019b0b9", None), download)
    with h5py.File(path, "r") as f:
        def get(split: str) -> tuple[np.ndarray, np.ndarray]:
            x = np.asarray(f[split]["data"], dtype=np.float32).reshape(-1, 1, 16, 16)
            return np.round(x * 255).astype(np.uint8), np.asarray(f[split]["target"], dtype=np.int64)

        (trx, try_), (tex, tey) = get("train"), get("test")
    return RawDataset("usps", trx, try_, tex, tey, 10)


MNIST_STAR_DOMAINS = ("mnist", "usps", "mnist-texture")


def texture_digits(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Grey digits ``(N, 1, H, W)`` over random colour textures: ``|texture - digit|`` per channel (MNIST-M's blend
    rule; the textures are smooth random colour noise, not BSDS500 photo patches, so this is a stand-in for MNIST-M,
    never MNIST-M itself)."""
    import torch

    n, _, h, w = x.shape
    coarse = torch.from_numpy(rng.random((n, 3, h // 4, w // 4), dtype=np.float32))
    smooth = torch.nn.functional.interpolate(coarse, size=(h, w), mode="bilinear", align_corners=False).numpy()
    tex = np.clip(0.85 * smooth + 0.15 * rng.random((n, 3, h, w), dtype=np.float32), 0, 1) * 255
    return np.abs(tex - x.astype(np.float32)).round().astype(np.uint8)


def _load_mnist_star(data_dir: Path, download: bool = True) -> RawDataset:
    """MNIST* (pFedRLLA App. B.1): three digit domains, all 3 x 28 x 28: MNIST (even-indexed MNIST images), USPS
    (16x16, resized to 28x28 bilinearly) and ``mnist-texture`` (odd-indexed MNIST images over random colour
    textures, :func:`texture_digits`, a documented stand-in for MNIST-M, which is not available here). Each
    sample's domain id is in ``train_domain`` / ``test_domain``; ``partition.kind = "domains"`` gives every client
    the data of one domain (``domain_shares``, 40 / 40 / 20 % of the clients as the paper's test setting)."""
    import torch

    mnist = DATASETS["mnist"](data_dir, download)
    usps = _load_usps(data_dir, download)
    rng = np.random.default_rng(0)  # the stand-in's textures are part of the dataset: fixed, not run-seeded

    def resize(x: np.ndarray) -> np.ndarray:
        t = torch.nn.functional.interpolate(torch.from_numpy(x).float(), size=(28, 28), mode="bilinear",
                                            align_corners=False)
        return t.round().clamp(0, 255).to(torch.uint8).numpy()

    def part(split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mx, my = getattr(mnist, f"{split}_x"), getattr(mnist, f"{split}_y")
        ux, uy = getattr(usps, f"{split}_x"), getattr(usps, f"{split}_y")
        xs = [np.repeat(mx[0::2], 3, axis=1), np.repeat(resize(ux), 3, axis=1), texture_digits(mx[1::2], rng)]
        ys = [my[0::2], uy, my[1::2]]
        dom = np.concatenate([np.full(len(y), d, dtype=np.int64) for d, y in enumerate(ys)])
        return np.concatenate(xs), np.concatenate(ys), dom

    trx, tr_y, trd = part("train")
    tex, te_y, ted = part("test")
    return RawDataset("mnist_star", trx, tr_y, tex, te_y, 10, mean=(0.5,) * 3, std=(0.5,) * 3,
                      extra={"domain_names": MNIST_STAR_DOMAINS}, train_domain=trd, test_domain=ted)


DATASETS: dict[str, Callable[..., RawDataset]] = {
    "mnist": _load_idx_dataset("mnist", "mnist", _MNIST_FILES, _LECUN),
    "fmnist": _load_idx_dataset("fmnist", "fashion-mnist", _FMNIST_FILES, _ZALANDO),
    "cifar10": _load_cifar("cifar10"),
    "cifar100": _load_cifar("cifar100"),
    "ag_news": _load_ag_news,
    "usps": _load_usps,
    "mnist_star": _load_mnist_star,
}


# The optional packages a built-in dataset's reader imports: dataset -> ((module, extra that installs it), ...).
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "usps": (("h5py", "usps"),),  # usps.h5
    "mnist_star": (("h5py", "usps"),),  # its USPS domain
}


def require_packages(name: str) -> dict[str, Any]:
    """The optional packages dataset ``name`` reads with (:data:`NEEDS`), imported; one that is missing raises a
    one-line :class:`~fedblend.common.optional.MissingPackageError` naming the dataset and the extra that
    installs it, so a run stops before it writes anything instead of in a traceback from inside the reader."""
    return {module: require(module, extra, f"dataset {name!r}") for module, extra in NEEDS.get(name, ())}


# What each dataset's samples are, known without reading it (used to check a model fits before any loading):
# kind, and for images (channels, side).
INPUTS: dict[str, tuple[str, tuple[int, int] | None]] = {
    "mnist": ("image", (1, 28)), "fmnist": ("image", (1, 28)), "cifar10": ("image", (3, 32)),
    "cifar100": ("image", (3, 32)), "usps": ("image", (1, 16)), "ag_news": ("text", None),
    "mnist_star": ("image", (3, 28)), **{name: ("image", (1, 8)) for name in SYNTHETIC},
}


def load_dataset(name: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> RawDataset:
    """Load dataset ``name`` (see :data:`DATASETS` and ``synthetic``) from the data directory.

    A file that exists but cannot be read (no permission, truncated, not the expected format) raises
    :class:`~fedblend.common.errors.DataError` naming the dataset and the reason."""
    if name in SYNTHETIC:
        return make_synthetic(**SYNTHETIC[name])
    if find_dataset(name) is None:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS) + sorted(SYNTHETIC)}, a plug-in's "
                         f"entry point (group fedblend.datasets) or 'package.module:function'")
    require_packages(name)
    folder = resolve_data_dir(data_dir)
    try:
        with plugin_guard(DATASETS[name], "dataset", "load", name=name):  # a plug-in's loader: named when it raises
            raw = DATASETS[name](folder, download)
    except FedblendError:
        raise
    except (OSError, ValueError, EOFError, KeyError, tarfile.TarError, pickle.UnpicklingError) as exc:
        raise DataError(f"cannot read dataset {name!r} from {folder}: {exc}") from exc
    if not isinstance(raw, RawDataset):
        raise plugins.PluginError(f"dataset plug-in {name!r} returned a {type(raw).__name__}, not a "
                                  f"fedblend.data.raw.RawDataset")
    return raw


def find_dataset(name: str) -> Callable[..., RawDataset] | None:
    """The loader of dataset ``name``: built in, or a plug-in (``fedblend.common.plugins``: an entry point of
    ``fedblend.datasets`` or ``"package.module:function"``), a callable ``(data_dir: Path, download: bool) ->
    RawDataset`` registered under ``name``; its optional attribute ``inputs`` (``("image", (channels, side))`` or
    ``("text", None)``) lets a config check that the model fits before loading. None if there is no such dataset."""
    if name in DATASETS or name in SYNTHETIC:
        return DATASETS.get(name, make_synthetic)
    obj = plugins.find("dataset", name)
    if obj is None:
        return None
    DATASETS[name] = plugins.check_callable("dataset", name, obj, "a callable (data_dir, download) -> RawDataset")
    inputs = getattr(obj, "inputs", None)
    if inputs is not None:
        kind, shape = inputs
        INPUTS[name] = (str(kind), tuple(shape) if shape is not None else None)
    return obj

