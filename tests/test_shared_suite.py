"""The contract every registered method (and every method + transform) must pass, on tiny data:

two rounds and a checkpoint round trip (resume == uninterrupted); training loss decreases; determinism; partial
participation; replies carry only the method's shared parameter names; evaluation leaves server and client
states unchanged; states survive the state codec; a client half run with nothing but its own data gives the same
results (isolation); the process backend gives the same results as the sequential one, bit for bit.

The checks live in :mod:`fedblend.testing`, so a user's own method runs exactly these from its package's tests
(``class TestMine(fedblend.testing.MethodContract)``; ``examples/myprox/tests`` does).
"""

import pytest

from fedblend.algorithms import METHODS, TRANSFORMS, build_method
from fedblend.common.errors import MessageError
from fedblend.testing import (
    check_client_half_isolated,
    check_device,
    check_evaluation_leaves_states_unchanged,
    check_partial_participation,
    check_process_backend_equals_sequential,
    check_rounds_resume_and_loss,
    off_device,
)


def hosts(transform: str) -> list[str]:
    """The methods the registry lets host ``transform``: for ALA, those that accept transforms and whose clients
    train from a model the server sends (a global model, or FedAMP's u_i; ``traits.trains_from_received``). FedALA
    is already FedAvg + ALA."""
    out = []
    for m in sorted(METHODS):
        try:
            build_method(f"{m}+{transform}")
        except ValueError:
            continue
        out.append(m)
    return [m for m in out if m != "fedala"]


# every transform on every method that can host it
SPECS = sorted(METHODS) + [f"{m}+{t}" for t in sorted(TRANSFORMS) for m in hosts(t)]

#: ``[options]`` a spec runs this suite, the contract suite and its synthetic golden with, instead of its defaults
#: (every other spec runs with its defaults). fedamp+ala: FedAMP's defaults (FedALA's tuned alpha_K = 1000,
#: sigma = 0.1) give the four close synthetic clients self weights xi_ii of about -3e4, so u_i extrapolates far
#: beyond the clients' models (docs/methods/fedamp.md); plain FedAMP feels u_i only through a proximal pull of
#: lambda / alpha_K = 1e-3, but ALA takes u_i's lower layers whole (FedALA Eq. 4) and the run diverges in round 2.
#: alpha_K = 0.5, sigma = 50 keep every xi_ii > 0 (alpha_K <= sigma / (M - 1)): u_i a convex mix of the models.
SUITE_OPTIONS: dict[str, dict] = {"fedamp+ala": {"alpha_k": 0.5, "sigma": 50.0}}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("spec", SPECS)
def test_method_contract(spec, tiny_fed, tmp_path):
    check_rounds_resume_and_loss(spec, tiny_fed, tmp_path, SUITE_OPTIONS.get(spec))


@pytest.mark.parametrize("spec", SPECS)
def test_partial_participation_and_shared_names(spec, tiny_fed):
    check_partial_participation(spec, tiny_fed, SUITE_OPTIONS.get(spec))


@pytest.mark.parametrize("spec", SPECS)
def test_evaluation_leaves_states_unchanged_and_states_are_data(spec, tiny_fed):
    check_evaluation_leaves_states_unchanged(spec, tiny_fed, SUITE_OPTIONS.get(spec))


@pytest.mark.parametrize("spec", SPECS)
def test_client_half_needs_only_its_own_data(spec, tiny_fed):
    check_client_half_isolated(spec, tiny_fed, SUITE_OPTIONS.get(spec))


# What crosses the process boundary is each method's messages and states (every method here) and a transform's
# state, which does not depend on its host: one host per transform (spawning workers is this suite's main cost).
PROCESS_SPECS = sorted(METHODS) + [f"fedprox+{t}" for t in sorted(TRANSFORMS)]


@pytest.mark.parametrize("spec", PROCESS_SPECS)
def test_process_backend_equals_sequential(spec, tiny_fed):
    check_process_backend_equals_sequential(spec, tiny_fed)


def test_contract_checks_catch_methods_that_break_them(tiny_fed, tmp_path):
    """The shared checks fail on methods that break the contract, so a green suite (here or in a user's package)
    means something: evaluation that changes the client state, a reply carrying an undeclared tensor, a server
    drawing from the global random generator (resume no longer equals an uninterrupted run)."""
    from tests.contract_breakers import Greedy, Leaky, Noisy

    with pytest.raises(AssertionError, match="evaluation changed a client state"):
        check_evaluation_leaves_states_unchanged(Greedy, tiny_fed)
    with pytest.raises(MessageError, match=r"params\['secret'\] is not a parameter of the model"):
        check_partial_participation(Leaky, tiny_fed)  # the engine's reply check names it before the suite's
    with pytest.raises(AssertionError, match="resumed run != uninterrupted run"):
        check_rounds_resume_and_loss(Noisy, tiny_fed, tmp_path)
    with pytest.raises(AssertionError, match="two runs on cpu differ"):  # the GPU check's repeat, run on the CPU
        check_device(Noisy, tiny_fed, "cpu")


def test_the_device_check_passes_on_the_cpu_and_names_state_left_off_the_device(tiny_fed):
    """``check_device`` (what ``MethodContract.test_runs_on_cuda`` runs on a GPU) passes for a sound method on
    the one device every machine has, and ``off_device`` names each floating-point tensor on another device."""
    import torch

    check_device("fedala", tiny_fed, "cpu")
    state = {"a": {"w": torch.zeros(2)}, "n": [torch.zeros(1, dtype=torch.long), torch.ones(3)]}
    assert off_device(state, "cpu", "s") == []
    assert off_device(state, "cuda", "s") == ["s.a.w (cpu, (2,))", "s.n[1] (cpu, (3,))"]
