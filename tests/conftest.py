"""Shared fixtures. Tests that need the real archives use ``real_data_dir`` and skip with a reason when the
data directory (``FEDBLEND_DATA``, default ``../shared/data`` beside the repository) lacks them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _data_dir() -> Path:
    return Path(os.environ.get("FEDBLEND_DATA") or REPO.parent / "shared" / "data")


@pytest.fixture
def real_data_dir(monkeypatch) -> Path:
    """The data directory; also exported as ``FEDBLEND_DATA`` for the test, so code that resolves the directory
    itself (the CLI, ``load_dataset`` without a path) finds the same one as the test does when the variable is
    unset and the default ``../shared/data`` is used."""
    d = _data_dir()
    if not (d / "fashion-mnist" / "train-images-idx3-ubyte.gz").exists() or not (d / "mnist").exists():
        pytest.skip(f"real dataset archives not found in {d} (set FEDBLEND_DATA to the shared data directory)")
    monkeypatch.setenv("FEDBLEND_DATA", str(d))
    return d


@pytest.fixture
def tiny_fed():
    """A 4-client federated version of the synthetic dataset (no files needed)."""
    from fedblend.data.federated import PartitionSpec, build_federated
    from fedblend.data.synthetic import make_synthetic

    spec = PartitionSpec(kind="dirichlet", alpha=1.0, num_clients=4, min_samples=5, split="merge")
    return build_federated(make_synthetic(), spec, seed=0)


@pytest.fixture(scope="module")
def one_thread():
    """Run a module's tests with one torch thread: tiny tensors are faster so, the golden histories were recorded
    so, and the process backend's workers run one thread each (use with ``pytest.mark.usefixtures``)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False, help="also run the tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="slow (minutes): run with pytest --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def flwr_bin():
    """Skips with the reason when Flower's executables (the extra) are not installed."""
    from fedblend.flower.deploy import _bin

    try:
        _bin("flower-superlink")
    except Exception as exc:  # noqa: BLE001
        pytest.skip(str(exc))


@pytest.fixture(autouse=True, scope="module")
def _method_registry_as_found():
    """Each test module leaves the method and transform registries as it found them: a plug-in a test loads by
    path (``method = "tests.plugin_faults:Faulty"``) registers itself, and would otherwise be seen by every later
    module that iterates the registry (the contract suite, the generated docs), so results depended on test order."""
    from fedblend.algorithms import METHODS, TRANSFORMS

    methods, transforms = dict(METHODS), dict(TRANSFORMS)
    yield
    for table, before in ((METHODS, methods), (TRANSFORMS, transforms)):
        table.clear()
        table.update(before)
