"""The contract every registered method (and every method + transform) must pass, on tiny data:

two rounds and a checkpoint round trip (resume == uninterrupted); training loss decreases; determinism; partial
participation; replies carry only the method's shared parameter names; evaluation leaves server and client
states unchanged; states survive the state codec; a client half run with nothing but its own data gives the same
results (isolation); the process backend gives the same results as the sequential one, bit for bit.
"""

import pytest

from fedblend.algorithms import METHODS, TRANSFORMS
from fedblend.common.codec import decode, encode
from fedblend.core.backends import ProcessBackend, SequentialBackend
from fedblend.core.client import ClientRuntime
from tests.helpers import same_state, tiny_sim, without_timings

# every transform on every method that has a global model to blend from and accepts transforms (FedALA is
# already FedAvg + ALA)
HOSTS = [m for m in sorted(METHODS) if METHODS[m].has_global and METHODS[m].accepts_transforms and m != "fedala"]
SPECS = sorted(METHODS) + [f"{m}+{t}" for t in sorted(TRANSFORMS) for m in HOSTS]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("spec", SPECS)
def test_method_contract(spec, tiny_fed, tmp_path):
    sim = tiny_sim(tiny_fed, spec, rounds=4, seed=1)
    sim.run_round(), sim.run_round()
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0
    sim.save(tmp_path / "ck.pt")
    twin = tiny_sim(tiny_fed, spec, rounds=4, seed=1)
    twin.restore(tmp_path / "ck.pt")
    assert same_state(twin.server, sim.server) and same_state(twin.store.states, sim.store.states)
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history)  # resume from checkpoint == uninterrupted
    losses = [m["train_loss"] for m in sim.history]
    assert losses[-1] < losses[0], losses


class Recording(SequentialBackend):
    """The sequential backend, keeping every job and result it ran."""

    def __init__(self):
        self.log = []

    def run(self, jobs):
        results = super().run(jobs)
        self.log += list(zip(jobs, results))
        return results


@pytest.mark.parametrize("spec", SPECS)
def test_partial_participation_and_shared_names(spec, tiny_fed):
    backend = Recording()
    sim = tiny_sim(tiny_fed, spec, rounds=3, seed=4, join_ratio=0.5, backend=backend)
    sim.run()
    assert all(len(m["selected"]) == 2 for m in sim.history) and 0.0 <= sim.history[-1]["acc"] <= 1.0
    assert len({tuple(m["selected"]) for m in sim.history}) > 1  # different clients join different rounds
    shared = set(sim.method.shared_names(sim.run_info))
    trained = [(j, r) for j, r in backend.log if j.phase != "evaluate"]
    assert trained
    last: dict = {}  # each client receives exactly the state its own previous exchange returned (None at first)
    full: dict = {}  # (round, client) -> whether one of its replies carried every shared name
    for job, res in trained:
        assert job.state is last.get(job.cid), (spec, job.cid)
        last[job.cid] = res.state
        sent = set(res.reply.params())
        assert sent <= shared, (spec, sorted(sent - shared))  # never a name the method does not share
        full[(job.rnd, job.cid)] = full.get((job.rnd, job.cid), False) or sent == shared
    if METHODS[spec.split("+")[0]].name == "local":
        assert not any(full.values()) and all(res.reply.num_bytes == 0 for _, res in trained)
    else:  # in every round, each joining client sends its shared parameters in one of the round's exchanges
        assert all(full.values()), (spec, sorted(k for k, v in full.items() if not v))
    never = set(range(tiny_fed.num_clients)) - {c for m in sim.history for c in m["selected"]}
    assert all(c not in sim.store for c in never)  # a client never contacted holds no state


@pytest.mark.parametrize("spec", SPECS)
def test_evaluation_leaves_states_unchanged_and_states_are_data(spec, tiny_fed):
    sim = tiny_sim(tiny_fed, spec, rounds=3, seed=2)
    sim.run_round(), sim.run_round()
    before_server = decode(encode(sim.server))
    before_clients = decode(encode(sim.store.states))
    # the codec round trip is exact (states hold only data)
    assert same_state(before_server, sim.server) and same_state(before_clients, sim.store.states)
    flat = encode(sim.store.states, as_numpy=True)
    assert same_state(decode(flat), sim.store.states)
    e1 = sim.evaluate(1)
    e2 = sim.evaluate(1)
    assert e1 == e2 or all((a == b) or (a != a and b != b) for a, b in zip(e1.values(), e2.values()))
    assert same_state(before_server, sim.server) and same_state(before_clients, sim.store.states)


class Isolated(SequentialBackend):
    """Every job runs in a fresh client runtime that holds only that client's data: a client half that reached
    for another client's data would fail here."""

    def start(self, method, run, data, tree):
        self.args = (method, run, data, tree)

    def run(self, jobs):
        method, run, data, tree = self.args
        return [ClientRuntime(method, run, {j.cid: data[j.cid]}, tree).handle(j) for j in jobs]


@pytest.mark.parametrize("spec", SPECS)
def test_client_half_needs_only_its_own_data(spec, tiny_fed):
    a = tiny_sim(tiny_fed, spec, rounds=2, seed=3, join_ratio=0.5)
    b = tiny_sim(tiny_fed, spec, rounds=2, seed=3, join_ratio=0.5, backend=Isolated())
    a.run(), b.run()
    assert without_timings(a.history) == without_timings(b.history)
    with pytest.raises(KeyError, match="not held"):
        ClientRuntime(a.method, a.run_info, {0: tiny_fed.clients[0]}, a.tree).ctx(1, 0, "train")


# What crosses the process boundary is each method's messages and states (every method here) and a transform's
# state, which does not depend on its host: one host per transform (spawning workers is this suite's main cost).
PROCESS_SPECS = sorted(METHODS) + [f"fedprox+{t}" for t in sorted(TRANSFORMS)]


@pytest.mark.parametrize("spec", PROCESS_SPECS)
def test_process_backend_equals_sequential(spec, tiny_fed):
    seq = tiny_sim(tiny_fed, spec, rounds=2, seed=5, join_ratio=0.75, momentum=0.5, optimizer_state="keep")
    seq.run()
    with tiny_sim(tiny_fed, spec, rounds=2, seed=5, join_ratio=0.75, momentum=0.5, optimizer_state="keep",
                  backend=ProcessBackend(workers=2, threads=1)) as par:
        par.run()
    assert without_timings(seq.history) == without_timings(par.history)
    assert same_state(seq.server, par.server) and same_state(seq.store.states, par.store.states)
