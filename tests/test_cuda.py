"""Every method on a CUDA device (``device = "cuda"``); skipped where PyTorch sees no CUDA device (CI has none;
``bookkeeping/gpu_check.sh`` runs this module on a GPU machine).

What a GPU must not change, checked for every registered method and every method + transform:

* the run is reproducible there: two runs on the same device give the same history and states, bit for bit;
* it computes what the CPU computes: the histories agree within float reassociation (cuBLAS / cuDNN sum in
  another order than the CPU kernels; no random draw may move to the device's generator, which would change the
  numbers outright);
* the states live on the device: every floating-point tensor of the server and client states is a CUDA tensor
  (no silent copy back to the CPU);
* a checkpoint written on the device restores there, and the resumed run equals the uninterrupted one, bit for
  bit;
* vmap's batched clients run there and agree with the sequential backend on the same device.

A convolutional model (cuDNN's kernels, not only cuBLAS's) is checked for the same reproducibility with a few
methods on 28 x 28 synthetic images.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from fedblend.common.histories import diff_histories
from fedblend.core.engine import Simulation
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.vmap import VmapBackend
from fedblend.data.federated import PartitionSpec, build_federated
from fedblend.data.synthetic import make_synthetic
from fedblend.testing import check_device, off_device, same_state, tiny_sim, without_timings
from tests.test_shared_suite import SPECS, SUITE_OPTIONS

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (PyTorch sees none)"),
              pytest.mark.usefixtures("one_thread")]

#: CPU and GPU kernels sum in different orders; over two tiny rounds that moves metrics by ~1e-6 relative.
REL, ABS = 1e-4, 1e-6


def gpu_sim(fed, spec: str, device: str, model: str = "mlp", rounds: int = 2, backend=None) -> Simulation:
    return tiny_sim(fed, spec, SUITE_OPTIONS.get(spec), rounds=rounds, seed=1, model=model, join_ratio=0.75,
                    backend=backend, protocol=EvalProtocol(before_after=True), device=device)


def run(sim: Simulation) -> Simulation:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # vmap's one-by-one notice
        sim.run()
    return sim


def metrics(sim: Simulation) -> list[dict]:
    return [{k: v for k, v in m.items() if not k.startswith("vmap_")} for m in without_timings(sim.history)]


@pytest.mark.parametrize("spec", SPECS)
def test_every_method_on_cuda_repeats_bit_for_bit_matches_the_cpu_and_keeps_its_states_there(spec, tiny_fed):
    """``fedblend.testing.check_device``: the same check a plug-in method's ``MethodContract`` runs on a GPU."""
    check_device(spec, tiny_fed, "cuda", options=SUITE_OPTIONS.get(spec), rel=REL, abs_=ABS)


@pytest.mark.parametrize("spec", SPECS)
def test_every_method_resumes_on_cuda_and_vmap_agrees_there(spec, tiny_fed, tmp_path):
    sim = gpu_sim(tiny_fed, spec, "cuda", rounds=3)
    sim.run_round()
    sim.save(tmp_path / "ck.pt")
    twin = gpu_sim(tiny_fed, spec, "cuda", rounds=3)
    twin.restore(tmp_path / "ck.pt")
    assert same_state(twin.server, sim.server) and same_state(twin.store.states, sim.store.states)
    assert off_device(twin.server, "cuda", "server") + off_device(twin.store.states, "cuda", "clients") == []
    run(sim), run(twin)
    assert without_timings(sim.history) == without_timings(twin.history), "resumed CUDA run != uninterrupted"
    vm = run(gpu_sim(tiny_fed, spec, "cuda", rounds=3, backend=VmapBackend()))
    assert diff_histories(metrics(sim), metrics(vm), rel=REL, abs_=ABS) == []


@pytest.fixture(scope="module")
def image_fed():
    spec = PartitionSpec(kind="dirichlet", alpha=1.0, num_clients=4, min_samples=5, split="merge")
    return build_federated(make_synthetic(image_size=28, train_per_class=30, test_per_class=10), spec, seed=0)


@pytest.mark.parametrize("model", ["cnn4", "lenet5"])
@pytest.mark.parametrize("spec", ["fedavg", "fedala", "fedapa", "fedalp", "pfedrlla"])
def test_a_convolutional_model_on_cuda_repeats_bit_for_bit_and_matches_the_cpu(spec, model, image_fed):
    first, second = (run(gpu_sim(image_fed, spec, "cuda", model=model)) for _ in range(2))
    assert without_timings(first.history) == without_timings(second.history), "two CUDA runs differ"
    assert same_state(first.store.states, second.store.states)
    cpu = run(gpu_sim(image_fed, spec, "cpu", model=model))
    assert diff_histories(metrics(cpu), metrics(first), rel=1e-3, abs_=1e-5) == []
