"""The shared contract suite, for your own method's tests: one import, one class.

Every built-in method passes these checks (``tests/test_shared_suite.py`` runs them on all of them); a method of
your own -- registered through an entry point, named ``"package.module:Class"``, or just a class -- runs the
same ones from your package's tests::

    # tests/test_my_method.py
    from fedblend.testing import MethodContract

    class TestMyProx(MethodContract):
        method = "myprox"                  # a name, "pkg.module:Class", "myprox+ala", or the class itself
        options = {"mu": 0.01}             # its [options] (optional)

``pytest`` collects the class (its name starts with ``Test``) and runs, on a tiny synthetic federation of 4
clients (no files needed, a few seconds):

* ``test_rounds_resume_and_loss``: two rounds, a checkpoint round trip (the resumed run equals the uninterrupted
  one), accuracy in [0, 1], training loss decreasing;
* ``test_partial_participation_and_shared_names``: half the clients per round; each client receives exactly
  the state its previous exchange returned; replies carry only the method's shared parameter names, and all of
  them; a client never contacted holds no state;
* ``test_replies_keep_the_contract``: every training reply is a Message whose model parameters have the model's
  shapes and a floating dtype, whose parameter records name nothing the model lacks (beyond the method's
  ``extra_entries``) and whose ``num_samples`` is positive (:mod:`fedblend.core.replies`: the check the engine
  runs before every aggregation, here as a test of its own that names each offending entry);
* ``test_evaluation_leaves_states_unchanged``: evaluating twice gives the same numbers and changes no server or
  client state, and the states survive the state codec (they are data);
* ``test_client_half_needs_only_its_own_data``: the client half run with only its own client's data gives the
  same results;
* ``test_process_backend_equals_sequential``: worker processes give the same results bit for bit (the method
  must be importable by name: module level in an importable module; ``process_backend = False`` skips it);
* ``test_runs_on_cuda`` (skipped where PyTorch sees no CUDA device): on the GPU two runs give the same results
  bit for bit, every floating-point state tensor lives there, and the results agree with the CPU's within float
  reassociation.

The same checks are plain functions (``check_rounds_resume_and_loss(method, fed, tmp_path)``, ...) for other test
layouts, and :func:`tiny_federation` / :func:`tiny_sim` build the setting they run in.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from fedblend.algorithms import build_method
from fedblend.algorithms.registry import make_options
from fedblend.common.codec import decode, encode
from fedblend.common.guard import guarded
from fedblend.core.backends import ProcessBackend, SequentialBackend
from fedblend.core.client import ClientRuntime
from fedblend.core.engine import Simulation
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.method import Method
from fedblend.core.replies import reply_errors, where_reply
from fedblend.core.sampling import SamplingConfig
from fedblend.core.template import shared_names
from fedblend.core.training import TrainConfig
from fedblend.data.federated import FederatedData, PartitionSpec, build_federated
from fedblend.data.synthetic import make_synthetic

__all__ = ["MethodContract", "check_client_half_isolated", "check_device", "check_evaluation_leaves_states_unchanged",
           "check_partial_participation", "check_process_backend_equals_sequential", "check_replies",
           "check_rounds_resume_and_loss", "one_thread", "same_state", "tiny_federation", "tiny_sim", "without_timings"]

MethodLike = str | type[Method]


# ------------------------------------------------------------------------------------------------ building blocks
def tiny_federation(num_clients: int = 4, seed: int = 0) -> FederatedData:
    """The contract suite's federation: the synthetic dataset (4 classes of 8x8 images) split Dirichlet(1.0) over
    ``num_clients`` clients, train and test merged then 75 / 25 per client."""
    spec = PartitionSpec(kind="dirichlet", alpha=1.0, num_clients=num_clients, min_samples=5, split="merge")
    return build_federated(make_synthetic(), spec, seed=seed)


def make_method(method: MethodLike, options: Mapping[str, Any] | None = None,
                transforms: Mapping[str, Mapping[str, Any]] | None = None) -> Method:
    """A method object from a spec (``"fedprox+ala"``, a plug-in's name, ``"pkg.module:Class"``) or a class."""
    if isinstance(method, str):
        return build_method(method, options, transforms)
    if transforms:
        raise ValueError("transforms need the method as a spec string (e.g. 'pkg.module:Class+ala')")
    opts = make_options(method.options_cls, options, "options")
    with guarded(method, "method", "__init__", passes=(ValueError,)):  # as the registry builds it
        return method(opts)


def tiny_sim(fed: FederatedData, method: MethodLike = "fedavg", options=None, transforms=None, rounds: int = 3,
             seed: int = 0, model: str = "mlp", join_ratio: float = 1.0, backend=None,
             protocol: EvalProtocol | None = None, device: str = "cpu", **train) -> Simulation:
    """A simulation of ``method`` on ``fed`` (lr 0.05, batch 16, one epoch unless ``train`` says otherwise)."""
    cfg = TrainConfig(**{"lr": 0.05, "batch_size": 16, "epochs": 1, **train})
    return Simulation.create(make_method(method, options, transforms), fed, model, cfg, rounds, seed,
                             SamplingConfig(join_ratio=join_ratio), protocol, backend=backend, device=device)


def without_timings(history: list[dict]) -> list[dict]:
    """Round metrics minus wall-clock fields (``*seconds*`` and the ``*_share`` derived from them), which differ
    between otherwise identical runs."""
    return [{k: v for k, v in m.items() if "seconds" not in k and not k.endswith("_share")} for m in history]


def same_state(a, b) -> bool:
    """Whether two states (nested dicts / lists of tensors and numbers) are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch at one thread inside the block (tiny tensors are faster so, and the process backend's workers run
    one thread each, so sequential and process results are compared at the same thread count)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _opts(options, transforms) -> dict:
    return {"options": options, "transforms": transforms}


# ------------------------------------------------------------------------------------------------ the checks
def check_rounds_resume_and_loss(method: MethodLike, fed: FederatedData, tmp_path: str | Path, options=None,
                                 transforms=None, model: str = "mlp") -> None:
    """Two rounds; a checkpoint round trip equals the uninterrupted run; accuracy in [0, 1]; loss decreases."""
    kw = {**_opts(options, transforms), "model": model}
    sim = tiny_sim(fed, method, rounds=4, seed=1, **kw)
    sim.run_round(), sim.run_round()
    assert 0.0 <= sim.history[-1]["acc"] <= 1.0, sim.history[-1]["acc"]
    ck = Path(tmp_path) / "contract-ck.pt"
    sim.save(ck)
    twin = tiny_sim(fed, method, rounds=4, seed=1, **kw)
    twin.restore(ck)
    assert same_state(twin.server, sim.server), "the server state changed through a checkpoint"
    assert same_state(twin.store.states, sim.store.states), "client states changed through a checkpoint"
    sim.run(), twin.run()
    assert without_timings(sim.history) == without_timings(twin.history), "resumed run != uninterrupted run"
    losses = [m["train_loss"] for m in sim.history]
    assert losses[-1] < losses[0], f"training loss did not decrease over 4 rounds: {losses}"


class _Recording(SequentialBackend):
    """The sequential backend, keeping every job and result it ran."""

    def __init__(self):
        self.log = []

    def run(self, jobs):
        results = super().run(jobs)
        self.log += list(zip(jobs, results))
        return results


def check_partial_participation(method: MethodLike, fed: FederatedData, options=None, transforms=None,
                                model: str = "mlp") -> None:
    """Half the clients per round: different clients join different rounds; each client receives exactly the
    state its previous exchange returned; replies carry only (and, once per round, all of) the shared names."""
    backend = _Recording()
    sim = tiny_sim(fed, method, rounds=3, seed=4, join_ratio=0.5, backend=backend, model=model,
                   **_opts(options, transforms))
    sim.run()
    half = max(1, round(fed.num_clients * 0.5))
    assert all(len(m["selected"]) == half for m in sim.history) and 0.0 <= sim.history[-1]["acc"] <= 1.0
    assert len({tuple(m["selected"]) for m in sim.history}) > 1, "the same clients joined every round"
    shared = set(shared_names(sim.method, sim.run_info))
    trained = [(j, r) for j, r in backend.log if j.phase != "evaluate"]
    assert trained, "no client trained"
    last: dict = {}  # each client receives exactly the state its own previous exchange returned (None at first)
    full: dict = {}  # (round, client) -> whether one of its replies carried every shared name
    for job, res in trained:
        assert job.state is last.get(job.cid), f"client {job.cid} did not receive its own last state"
        last[job.cid] = res.state
        sent = set(res.reply.params())
        assert sent <= shared, f"a reply carries names the method does not share: {sorted(sent - shared)}"
        full[(job.rnd, job.cid)] = full.get((job.rnd, job.cid), False) or sent == shared
    if sim.method.name == "local":  # nothing travels
        assert not any(full.values()) and all(res.reply.num_bytes == 0 for _, res in trained)
    else:
        missing = sorted(k for k, v in full.items() if not v)
        assert not missing, f"(round, client) whose replies never carried every shared name: {missing}"
    never = set(range(fed.num_clients)) - {c for m in sim.history for c in m["selected"]}
    assert all(c not in sim.store for c in never), "a client never contacted holds a state"


class _ReplyChecking(SequentialBackend):
    """The sequential backend, holding every training reply to the reply contract as it comes back (before the
    engine sees it), and failing the test with each offending entry named."""

    def start(self, method, run, data, tree):
        super().start(method, run, data, tree)
        self.method, self.run_info, self.data = method, run, data

    def run(self, jobs):
        results = super().run(jobs)
        traits = self.method.traits
        for job, res in zip(jobs, results):
            if job.phase == "evaluate" or res is None:
                continue
            errors = reply_errors(res.reply, self.run_info.init_params, traits.param_records, traits.extra_entries,
                                  self.data[job.cid].num_train)
            assert not errors, f"{where_reply(self.method.label, job.cid, job.rnd, job.phase)}: " + "; ".join(errors)
        return results


def check_replies(method: MethodLike, fed: FederatedData, options=None, transforms=None, model: str = "mlp") -> None:
    """Every training reply of two rounds (all clients, then half) keeps the reply contract
    (:mod:`fedblend.core.replies`)."""
    for join_ratio in (1.0, 0.5):
        tiny_sim(fed, method, rounds=2, seed=6, join_ratio=join_ratio, backend=_ReplyChecking(), model=model,
                 **_opts(options, transforms)).run()


def check_evaluation_leaves_states_unchanged(method: MethodLike, fed: FederatedData, options=None, transforms=None,
                                             model: str = "mlp") -> None:
    """States are data (an exact codec round trip); evaluating twice gives the same numbers and changes nothing."""
    sim = tiny_sim(fed, method, rounds=3, seed=2, model=model, **_opts(options, transforms))
    sim.run_round(), sim.run_round()
    before_server = decode(encode(sim.server))
    before_clients = decode(encode(sim.store.states))
    assert same_state(before_server, sim.server), "the server state does not survive the state codec"
    assert same_state(before_clients, sim.store.states), "client states do not survive the state codec"
    assert same_state(decode(encode(sim.store.states, as_numpy=True)), sim.store.states)
    e1, e2 = sim.evaluate(1), sim.evaluate(1)
    assert same_state(e1, e2), "two evaluations of the same states differ"
    assert same_state(before_server, sim.server), "evaluation changed the server state"
    assert same_state(before_clients, sim.store.states), "evaluation changed a client state"


class _Isolated(SequentialBackend):
    """Every job runs in a fresh client runtime that holds only that client's data: a client half that reached
    for another client's data would fail here."""

    def start(self, method, run, data, tree):
        self.args = (method, run, data, tree)

    def run(self, jobs):
        method, run, data, tree = self.args
        return [ClientRuntime(method, run, {j.cid: data[j.cid]}, tree).handle(j) for j in jobs]


def check_client_half_isolated(method: MethodLike, fed: FederatedData, options=None, transforms=None,
                               model: str = "mlp") -> None:
    """A client half given nothing but its own client's data gives the same results."""
    kw = {**_opts(options, transforms), "model": model}
    a = tiny_sim(fed, method, rounds=2, seed=3, join_ratio=0.5, **kw)
    b = tiny_sim(fed, method, rounds=2, seed=3, join_ratio=0.5, backend=_Isolated(), **kw)
    a.run(), b.run()
    assert without_timings(a.history) == without_timings(b.history), "a client half depends on other clients' data"
    try:
        ClientRuntime(a.method, a.run_info, {0: fed.clients[0]}, a.tree).ctx(1, 0, "train")
    except KeyError as exc:
        assert "not held" in str(exc)
    else:  # pragma: no cover - the runtime itself is broken
        raise AssertionError("a runtime handed out another client's data")


def check_process_backend_equals_sequential(method: MethodLike, fed: FederatedData, options=None, transforms=None,
                                            model: str = "mlp") -> None:
    """Worker processes (each holding only its clients' data) give the sequential backend's results bit for bit,
    the before / after local training scores (``eval.before_after``) included."""
    kw = {**_opts(options, transforms), "model": model, "momentum": 0.5, "optimizer_state": "keep",
          "protocol": EvalProtocol(before_after=True)}
    seq = tiny_sim(fed, method, rounds=2, seed=5, join_ratio=0.75, **kw)
    seq.run()
    with tiny_sim(fed, method, rounds=2, seed=5, join_ratio=0.75, backend=ProcessBackend(workers=2, threads=1),
                  **kw) as par:
        par.run()
    assert without_timings(seq.history) == without_timings(par.history), "process backend != sequential"
    assert all("bp_acc" in m and "ap_acc" in m for m in par.history), "no before / after scores"
    assert same_state(seq.server, par.server) and same_state(seq.store.states, par.store.states)


def off_device(obj: Any, device: str, where: str = "") -> list[str]:
    """The paths of the floating-point tensors in a state that are not on ``device``'s kind of device."""
    if isinstance(obj, torch.Tensor):
        bad = obj.is_floating_point() and obj.device.type != torch.device(device).type
        return [f"{where} ({obj.device}, {tuple(obj.shape)})"] if bad else []
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in off_device(v, device, f"{where}.{k}")]
    if isinstance(obj, (list, tuple)):
        return [p for i, v in enumerate(obj) for p in off_device(v, device, f"{where}[{i}]")]
    return []


def check_device(method: MethodLike, fed: FederatedData, device: str = "cuda", options=None, transforms=None,
                 model: str = "mlp", rel: float = 1e-4, abs_: float = 1e-6) -> None:
    """On ``device`` (a GPU): two runs give the same results and states bit for bit, every floating-point state
    tensor lives there (nothing left behind on the CPU), and the results agree with a CPU run within ``rel`` /
    ``abs_`` (GPU kernels sum in another order; a random draw made on the device's generator instead of the
    CPU stream would change them outright)."""
    from fedblend.common.histories import diff_histories

    kw = {**_opts(options, transforms), "model": model, "protocol": EvalProtocol(before_after=True)}
    first, second, cpu = (tiny_sim(fed, method, rounds=2, seed=1, join_ratio=0.75, device=d, **kw)
                          for d in (device, device, "cpu"))
    for sim in (first, second, cpu):
        sim.run()
    assert without_timings(first.history) == without_timings(second.history), f"two runs on {device} differ"
    assert same_state(first.server, second.server) and same_state(first.store.states, second.store.states), \
        f"two runs on {device} end in different states"
    stray = off_device(first.server, device, "server") + off_device(first.store.states, device, "clients")
    assert stray == [], f"floating-point state not on {device}: {stray[:8]}"
    assert diff_histories(without_timings(cpu.history), without_timings(first.history), rel=rel, abs_=abs_) == []


# ------------------------------------------------------------------------------------------------ the pytest class
class MethodContract:
    """Subclass as ``Test<Name>`` in a test module and set :attr:`method` (see the module docstring)."""

    #: the method: a spec string (a registered or plug-in name, ``"pkg.module:Class"``, with ``+transform``s) or
    #: a :class:`~fedblend.core.method.Method` subclass
    method: MethodLike = "fedavg"
    #: its ``[options]`` table, and ``{transform: options}`` for the transforms named in the spec
    options: Mapping[str, Any] | None = None
    transforms: Mapping[str, Mapping[str, Any]] | None = None
    #: the model the checks train ("mlp" fits the synthetic data; a plug-in model's name works too)
    model: str = "mlp"
    #: run the process-backend check (spawns two worker processes: the method must be importable by name)
    process_backend: bool = True

    def federation(self) -> FederatedData:
        """The federation the checks run on (override for a method that needs other data)."""
        return tiny_federation()

    def _args(self) -> dict:
        return {"options": self.options, "transforms": self.transforms, "model": self.model}

    def test_rounds_resume_and_loss(self):
        """Two rounds, a checkpoint round trip, accuracy in [0, 1], training loss decreasing."""
        with one_thread(), tempfile.TemporaryDirectory() as tmp:
            check_rounds_resume_and_loss(self.method, self.federation(), tmp, **self._args())

    def test_partial_participation_and_shared_names(self):
        """Half the clients per round: states returned as left, replies carry exactly the shared names."""
        with one_thread():
            check_partial_participation(self.method, self.federation(), **self._args())

    def test_replies_keep_the_contract(self):
        """Every training reply passes the engine's reply check (:mod:`fedblend.core.replies`)."""
        with one_thread():
            check_replies(self.method, self.federation(), **self._args())

    def test_evaluation_leaves_states_unchanged(self):
        """Evaluating twice gives the same numbers and changes no state; the states survive the codec."""
        with one_thread():
            check_evaluation_leaves_states_unchanged(self.method, self.federation(), **self._args())

    def test_client_half_needs_only_its_own_data(self):
        """A client half run with only its own client's data gives the same results."""
        with one_thread():
            check_client_half_isolated(self.method, self.federation(), **self._args())

    def test_process_backend_equals_sequential(self):
        """Worker processes give the same results bit for bit (``process_backend = False`` skips it)."""
        if not self.process_backend:
            import pytest

            pytest.skip("process_backend = False")
        with one_thread():
            check_process_backend_equals_sequential(self.method, self.federation(), **self._args())

    def test_runs_on_cuda(self):
        """On a CUDA device: deterministic, states on the device, agreeing with the CPU (skipped without one)."""
        if not torch.cuda.is_available():
            import pytest

            pytest.skip("no CUDA device (PyTorch sees none)")
        with one_thread():
            check_device(self.method, self.federation(), "cuda", **self._args())
