"""Readers of the canonical archive formats: IDX (MNIST, Fashion-MNIST), the CIFAR python tarballs, LIBSVM text,
and news texts to token ids."""

from __future__ import annotations

import bz2
import gzip
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np


def read_idx(path: Path) -> np.ndarray:
    """Read a (gzipped) IDX file (MNIST format): magic 2049 = labels, 2051 = images."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    if magic >> 8 != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {magic})")
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: truncated IDX file ({arr.size} values, header says {dims})")
    return arr.reshape(dims)


def read_cifar_tarball(path: Path, variant: str = "cifar10") -> tuple[np.ndarray, ...]:
    """Read the CIFAR-10/100 python tarball: returns uint8 (N,3,32,32) images and int64 labels."""
    label_key = b"labels" if variant == "cifar10" else b"fine_labels"
    train_names = [f"data_batch_{i}" for i in range(1, 6)] if variant == "cifar10" else ["train"]
    test_names = ["test_batch"] if variant == "cifar10" else ["test"]
    parts: dict[str, dict] = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if base in train_names + test_names:
                f = tar.extractfile(member)
                assert f is not None
                parts[base] = pickle.load(f, encoding="bytes")
    missing = [n for n in train_names + test_names if n not in parts]
    if missing:
        raise ValueError(f"{path}: tarball lacks {missing}")

    def stack(names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        x = np.concatenate([np.asarray(parts[n][b"data"], dtype=np.uint8) for n in names])
        y = np.concatenate([np.asarray(parts[n][label_key], dtype=np.int64) for n in names])
        return x.reshape(-1, 3, 32, 32), y

    return (*stack(train_names), *stack(test_names))


def read_libsvm(path: Path, num_features: int) -> tuple[np.ndarray, np.ndarray]:
    """Read a (bz2) LIBSVM file: dense float32 features (N, F) and the raw integer labels."""
    opener = bz2.open if str(path).endswith(".bz2") else open
    xs, ys = [], []
    with opener(path, "rt") as f:
        for line in f:
            tokens = line.split()
            if not tokens:
                continue
            row = np.zeros(num_features, dtype=np.float32)
            for tok in tokens[1:]:
                i, v = tok.split(":")
                row[int(i) - 1] = float(v)
            ys.append(int(float(tokens[0])))
            xs.append(row)
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


_TOKEN = re.compile(r"[a-z0-9']+")


def tokenize(text: str) -> list[str]:
    """Lower-case word tokenizer (letters, digits, apostrophes) for the text datasets."""
    return _TOKEN.findall(text.lower())


def encode_texts(texts: list[str], max_len: int = 200, min_count: int = 1) -> tuple[np.ndarray, dict]:
    """Token ids (N, max_len), 0 = padding, 1 = unknown; vocabulary sorted by frequency then word."""
    counts: dict[str, int] = {}
    tokenized = [tokenize(t) for t in texts]
    for toks in tokenized:
        for w in toks:
            counts[w] = counts.get(w, 0) + 1
    words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    vocab = {w: i + 2 for i, w in enumerate(words)}
    ids = np.zeros((len(texts), max_len), dtype=np.int64)
    for r, toks in enumerate(tokenized):
        row = [vocab.get(w, 1) for w in toks[:max_len]]
        ids[r, : len(row)] = row
    return ids, vocab
