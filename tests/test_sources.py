import gzip
import io
import pickle
import sys
import tarfile

import numpy as np
import pytest

from fedblend.data import fetch as fetch_module
from fedblend.data import sources
from fedblend.data.sources import (
    ChecksumError,
    DataNotFoundError,
    FileSpec,
    fetch,
    load_dataset,
    md5sum,
    read_cifar_tarball,
    read_idx,
    read_libsvm,
)


def _write_idx(path, arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_read_idx_roundtrip(tmp_path):
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    _write_idx(tmp_path / "x.gz", arr)
    assert np.array_equal(read_idx(tmp_path / "x.gz"), arr)


def test_read_idx_truncated(tmp_path):
    header = bytes([0, 0, 0x08, 1]) + (10).to_bytes(4, "big")
    with gzip.open(tmp_path / "t.gz", "wb") as f:
        f.write(header + b"\x01\x02")
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "t.gz")


def test_md5_mismatch_is_a_clear_error(tmp_path):
    (tmp_path / "mnist").mkdir()
    (tmp_path / "mnist" / "f.bin").write_bytes(b"not the canonical bytes")
    with pytest.raises(ChecksumError, match=r"f\.bin has md5 .* expected 0123"):
        fetch(tmp_path, "mnist", FileSpec("f.bin", "0123", None), download=False)


def test_md5_match_passes(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f.bin").write_bytes(b"abc")
    assert fetch(tmp_path, "d", FileSpec("f.bin", md5sum(tmp_path / "d" / "f.bin"), None)) == tmp_path / "d" / "f.bin"


def test_missing_file_names_file_location_and_source(tmp_path):
    with pytest.raises(DataNotFoundError) as e:
        load_dataset("mnist", tmp_path, download=False)
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz" in msg and str(tmp_path / "mnist") in msg and "https://" in msg


def test_failed_download_says_which_file_and_where(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise OSError("network unreachable")

    monkeypatch.setattr(fetch_module.urllib.request, "urlopen", boom)
    with pytest.raises(DataNotFoundError, match=r"train-images.*download from https?://.*failed.*unreachable"):
        load_dataset("fmnist", tmp_path)


def test_cifar_reader_on_tiny_tarball(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "cifar-10-python.tar.gz"
    batches = {}
    with tarfile.open(path, "w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            data = rng.integers(0, 256, size=(3, 3072), dtype=np.uint8)
            labels = rng.integers(0, 10, size=3).tolist()
            batches[name] = (data, labels)
            blob = pickle.dumps({b"data": data, b"labels": labels})
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    trx, tr_y, tex, te_y = read_cifar_tarball(path, "cifar10")
    assert trx.shape == (15, 3, 32, 32) and tex.shape == (3, 3, 32, 32)
    assert np.array_equal(trx[0].reshape(-1), batches["data_batch_1"][0][0])
    assert te_y.tolist() == batches["test_batch"][1]


def test_libsvm_reader(tmp_path):
    (tmp_path / "u.txt").write_text("3 1:0.5 4:-1\n1 2:1\n")
    x, y = read_libsvm(tmp_path / "u.txt", 4)
    assert y.tolist() == [3, 1]
    assert x.tolist() == [[0.5, 0, 0, -1], [0, 1, 0, 0]]


def test_real_archives(real_data_dir):
    raw = load_dataset("fmnist", real_data_dir)
    assert raw.train_x.shape == (60000, 1, 28, 28) and raw.test_x.shape == (10000, 1, 28, 28)
    assert np.bincount(raw.train_y).tolist() == [6000] * 10
    mn = load_dataset("mnist", real_data_dir)
    assert np.bincount(mn.train_y).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
    ag = load_dataset("ag_news", real_data_dir)
    assert ag.test_x.shape[0] == 7600 and np.bincount(ag.test_y).tolist() == [1900] * 4


def test_real_usps_archive(real_data_dir):
    pytest.importorskip("h5py")
    raw = load_dataset("usps", real_data_dir)
    assert raw.train_x.shape == (7291, 1, 16, 16) and raw.test_x.shape == (2007, 1, 16, 16)
    assert raw.train_x.dtype == np.uint8 and raw.train_x.max() == 255 and sorted(set(raw.test_y.tolist())) == list(range(10))


@pytest.mark.parametrize("dataset", ["usps", "mnist_star"])
def test_a_dataset_whose_optional_package_is_missing_stops_the_run_in_one_line_before_writing(
        dataset, tmp_path, monkeypatch, capsys):
    """usps.h5 (USPS, and MNIST*'s USPS domain) needs h5py: without it ``fedblend run`` ends in one
    ``fedblend: error:`` line naming the extra, exit 2, and no run directory; ``load_dataset`` raises the same."""
    from fedblend.cli.main import main
    from fedblend.common.errors import ConfigError

    monkeypatch.setitem(sys.modules, "h5py", None)  # import fails
    with pytest.raises(ConfigError, match=rf"dataset '{dataset}' needs the h5py package.*pip install 'fedblend\[usps\]'"):
        load_dataset(dataset, tmp_path)
    out = tmp_path / "run"
    assert main(["run", "--set", f"dataset={dataset}", "--set", "model=cnn4", "--set", "rounds=1",
                 "--data-dir", str(tmp_path), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedblend: error: dataset") and "fedblend[usps]" in err[0]
    assert not out.exists()


def test_every_built_in_dataset_declares_its_inputs():
    """:data:`INPUTS` (the model-fits check before a run) knows every built-in dataset's sample kind and shape."""
    assert set(sources.DATASETS) | set(sources.SYNTHETIC) == set(sources.INPUTS)
