"""The round engine: the one loop every method runs in (the in-process runtime of the method interface).

Per round ``t`` (0-based internally, reported 1-based):

1. sample the joining clients (:mod:`fedblend.core.sampling`);
2. for each phase of the round (``method.phases``, one ``"train"`` exchange by default): the server half
   ``configure``s a message per joining client, the backend runs the client halves on them (each with its own
   state, initialised on the client at first contact), the new client states are stored and the server half
   ``aggregate``s the replies (:mod:`fedblend.core.exchange`: every message held to the channel rules, every
   training reply to the reply contract, NaN / inf in a reply or a client's new state stopped or skipped,
   :mod:`fedblend.core.divergence`; a client with no result left out), and a backend's ``report()`` is merged
   into the round's metrics;
3. every ``eval.every`` rounds (and at the last), every client evaluates its personalized model (the one
   ``eval.model`` names, ``Method.eval_choices``; and the global model, if the method has one) from an
   evaluation message, through the backend as well (with
   ``eval.select = "val"`` also on its validation split, as ``val_*`` metrics);
4. record metrics (:mod:`fedblend.core.round_metrics`: accuracy, loss, bytes down/up per client, seconds; the
   clients' stats as their mean over the selected clients, and their losses and the stats the method names in
   ``per_client_stats`` also per client, ``stats_per_client``) and checkpoint every ``k`` rounds.

**Divergence is never a result.** After each round the engine checks for divergence
(:mod:`fedblend.core.divergence`): NaN / inf in the server state, a client's reported losses or an evaluation
loss, every reply of a phase skipped as non-finite, or a loss past ``divergence_factor x max(ln C, L1)``. The
round's metrics then carry ``"diverged": reason``; ``on_divergence = "stop"`` raises
:class:`~fedblend.common.errors.DivergedError`, ``"warn"`` warns once and goes on (the run is still reported as
diverged at its end, :mod:`fedblend.experiment`).

The engine holds the server state and the client-state store; only messages and each client's own state reach
a client half, so the same method runs unchanged in worker processes or on Flower nodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import to_device
from fedblend.common.errors import MessageError
from fedblend.common.guard import method_guard
from fedblend.common.rng import SeedTree
from fedblend.core.backend import Backend
from fedblend.core.backends import SequentialBackend
from fedblend.core.checkpoint import FILENAME, load_checkpoint, save_checkpoint
from fedblend.core.client import EVALUATE, ClientJob, ClientRuntime
from fedblend.core.divergence import EVAL_LOSSES, LOSS_NAMES, DivergenceChecks, loss_alarms
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalCounts, EvalProtocol, per_client_counts, summarise
from fedblend.core.exchange import Exchanges
from fedblend.core.method import ClientCtx, Method, RunInfo, ServerCtx, State, server_tree
from fedblend.core.returns import returned
from fedblend.core.round_metrics import RoundTally, round_metrics
from fedblend.core.sampling import SamplingConfig, sample_clients
from fedblend.core.state import DISK_SNAPSHOT, ClientStore, is_snapshot
from fedblend.core.training import TrainConfig
from fedblend.data.federated import FederatedData
from fedblend.models.zoo import initial_model, model_params

__all__ = ["EVAL_CHUNK", "EVAL_LOSSES", "LOSS_NAMES", "Simulation"]
EVAL_CHUNK = 64  # evaluation messages built and run per batch of clients (bounds memory with many clients)


@dataclass
class Simulation(Exchanges, DivergenceChecks):
    """A run in progress: the public run facts, explicit mutable state (server, client store, history). Its
    exchanges are :class:`~fedblend.core.exchange.Exchanges`', its checks for divergence
    :class:`~fedblend.core.divergence.DivergenceChecks`'."""

    method: Method
    fed: FederatedData
    run_info: RunInfo
    sampling: SamplingConfig
    protocol: EvalProtocol
    server: State
    store: ClientStore
    tree: SeedTree
    history: list[dict] = field(default_factory=list)
    next_round: int = 0
    backend: Backend = field(default_factory=SequentialBackend)
    on_nonfinite: str = "stop"  # a reply with NaN / inf: "stop" the run or "skip" (drop) that client's update
    on_divergence: str = "stop"  # the run diverged (see the module docstring): "stop" it, or "warn" and go on
    divergence_factor: float = 100.0  # the finite loss-explosion bound, x max(ln C, first train_loss)
    diverged: dict | None = None  # the first divergence seen: {"round", "reason"}
    # progress only, never results: on_client("train" | "evaluate", jobs to come) as a round's client work or an
    # evaluation starts, then on_client("done", cid) as each client job finishes
    on_client: Callable[[str, int], None] | None = None
    _started: bool = False
    _alarms: list = field(default_factory=list)  # this round's divergence findings
    _loss_keys: list = field(default_factory=list)  # this round's client training losses (train_loss, ...)
    _origin: str | None = None  # where this round's first non-finite value appeared, when known

    def __post_init__(self) -> None:
        if not isinstance(self.backend, Backend):
            raise TypeError(f"backend must be a fedblend.core.backend.Backend (start / run / report / close), "
                            f"got {type(self.backend).__name__}")

    # ------------------------------------------------------------------------------------------- setup
    @classmethod
    def create(cls, method: Method, fed: FederatedData, model_name: str, train: TrainConfig, rounds: int,
               seed: int, sampling: SamplingConfig | None = None, protocol: EvalProtocol | None = None,
               backend: Backend | None = None, device: str = "cpu", on_nonfinite: str = "stop",
               store: ClientStore | None = None, on_divergence: str = "stop",
               divergence_factor: float = 100.0, init: str = "") -> Simulation:
        tree = SeedTree(seed)
        if torch.device(device).type == "cuda":  # same bits run after run (cuDNN's fastest kernels may add in a
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False  # varying order), and
            torch.backends.cudnn.allow_tf32 = False  # float32 convolutions in float32, as on the CPU (not TF32)
        model = initial_model(model_name, fed.info, tree.torch("model-init"), init).to(device)
        model.requires_grad_(False)
        protocol = protocol or EvalProtocol()
        method = method.evaluating(protocol.model)  # [eval] model: which of the method's models is evaluated
        with method_guard(method, "check_model"):
            method.check_model(model)
        run = RunInfo(model=model, init_params=model_params(model), train=train, num_clients=fed.num_clients,
                      rounds=rounds, seed=seed, device=str(device))
        fed = fed.to(device)  # client data moved once, not per batch
        sim = cls(method, fed, run, sampling or SamplingConfig(), protocol, {},
                  store or ClientStore(), tree, backend=backend or SequentialBackend(), on_nonfinite=on_nonfinite,
                  on_divergence=on_divergence, divergence_factor=divergence_factor)
        with method_guard(method, "init_server"):
            server = returned(method, "init_server", method.init_server(sim.sctx(0)))
        sim.server = to_device(sim._checked_server(server, "init_server", None), run.device)
        return sim

    @property
    def model(self):
        return self.run_info.model

    def sctx(self, rnd: int) -> ServerCtx:
        return ServerCtx(self.run_info, rnd, server_tree(self.tree, rnd))

    def client_runtime(self) -> ClientRuntime:
        """An in-process runtime over every client (what the sequential backend runs; for tests and tools)."""
        return ClientRuntime(self.method, self.run_info, dict(enumerate(self.fed.clients)), self.tree)

    def client_ctx(self, cid: int, rnd: int, phase: str = "train") -> ClientCtx:
        return self.client_runtime().ctx(cid, rnd, phase)

    def close(self) -> None:
        """Stop the backend (worker processes); the simulation can be started again."""
        if self._started:
            self.backend.close()
            self._started = False

    def __enter__(self) -> Simulation:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- one round
    def run_round(self) -> dict:
        """One round (module docstring): the phases' exchanges, the round's metrics row, evaluation when due, the
        divergence check; returns the row (also appended to ``history``)."""
        t = self.next_round
        sctx = self.sctx(t)
        t0 = time.perf_counter()
        tally = RoundTally(sample_clients(self.sampling, self.fed.num_clients, t, self.tree))
        self._alarms, self._origin = [], None
        self._train_phases(t, sctx, tally)
        train_seconds = time.perf_counter() - t0
        self._loss_keys = tally.loss_keys()
        self._alarms += loss_alarms(tally.selected, tally.stats, self._loss_keys,
                                    {c: self.fed.clients[c].num_train for c in tally.selected})
        metrics = round_metrics(t, tally, sctx.stats, self._loss_keys, self.method.traits.per_client_stats,
                                train_seconds)
        last = t + 1 == self.run_info.rounds
        if (t + 1) % max(1, self.protocol.every) == 0 or last:
            e0 = time.perf_counter()
            metrics.update(self.evaluate(t))
            if self.protocol.select == "val":
                metrics.update({f"val_{k}": v for k, v in self.evaluate(t, "val").items()})
            metrics["eval_seconds"] = time.perf_counter() - e0
        metrics.update(self.backend.report())  # what the backend noticed this round (faults, refusals, counts)
        self.history.append(metrics)
        self.next_round = t + 1
        self.diverging(metrics)
        return metrics


    def evaluate(self, t: int, split: str | None = None) -> dict:
        """Personalized (and global) accuracy over all clients, per :class:`EvalProtocol` (on ``split``, default
        the protocol's): each client evaluates from the server's evaluation message and its own state; no state
        changes."""
        sctx = self.sctx(t)
        config = {"split": split or self.protocol.split, "batch_size": self.protocol.batch_size}
        personal, glob = [], []
        answered: list[int] = []  # the clients behind ``personal`` / ``glob``, in order
        missing = 0
        bad: dict[str, list[int]] = {}  # clients whose model's evaluation loss is NaN / inf, per model
        cids = self.eval_clients(t)
        if self.on_client is not None:
            self.on_client("evaluate", len(cids))
        for lo in range(0, len(cids), EVAL_CHUNK):
            jobs = []
            for cid in cids[lo : lo + EVAL_CHUNK]:
                with method_guard(self.method, "configure_evaluate", t, cid):
                    msg = returned(self.method, "configure_evaluate", self.method.configure_evaluate(self.server, cid,
                                                                                                      sctx), t, cid)
                msg.config.update(config)
                self._check_channels(msg, EVALUATE, cid, reply=False)
                jobs.append(ClientJob(EVALUATE, cid, t, msg, self.store.get(cid)))
            for job, res in zip(jobs, self._run_jobs(jobs)):
                if res is None:  # a client that did not answer is left out of the pooled accuracy
                    missing += 1
                    continue
                self._check_channels(res.reply, EVALUATE, job.cid, reply=True)
                own = EvalCounts.from_metrics(res.reply.metrics)
                if own is None:
                    raise MessageError(f"{self.method.label}: client {job.cid}'s evaluation reply has no "
                                       f"correct / loss / n in its metrics")
                other = EvalCounts.from_metrics(res.reply.metrics, GLOBAL_PREFIX)
                answered.append(job.cid)
                personal.append(own)
                if other is not None:
                    glob.append(other)
                for which, counts in (("personalized", own), ("global", other)):
                    if counts is not None and counts.nonfinite_loss:
                        bad.setdefault(which, []).append(job.cid)
        for which, bad_cids in bad.items():
            self._alarms.append(f"the {which} model of {len(bad_cids)} client(s) (client {bad_cids[0]} first) has a "
                                f"NaN or inf evaluation loss on the {config['split']} split")
        out = summarise(personal)
        if len(cids) < self.fed.num_clients:
            out["eval_clients"] = len(cids)
        if missing:
            out["eval_missing"] = missing
        if glob:
            out.update({f"global_{k}": v for k, v in summarise(glob).items()})
        out["per_client"] = per_client_counts(answered, personal)
        if glob:
            out["global_per_client"] = per_client_counts(answered, glob)
        return out

    def eval_clients(self, t: int) -> list[int]:
        """The clients evaluated in round ``t``: all, or ``eval.clients`` of them drawn from the seed tree (the
        same subset for every method and backend with this seed; a different one each round)."""
        n, k = self.fed.num_clients, self.protocol.clients
        if k is None or k >= n:
            return list(range(n))
        return sorted(torch.randperm(n, generator=self.tree.torch("eval-clients", t))[:k].tolist())

    # ------------------------------------------------------------------------------------------- the loop
    def run(self, on_round: Callable[[dict], None] | None = None, checkpoint_dir: str | Path | None = None,
            checkpoint_every: int = 0, extra_state: dict | None = None) -> list[dict]:
        while self.next_round < self.run_info.rounds:
            metrics = self.run_round()
            if checkpoint_dir is not None and checkpoint_every > 0 and (
                    self.next_round % checkpoint_every == 0 or self.next_round == self.run_info.rounds):
                self.save(Path(checkpoint_dir) / FILENAME, extra_state)
            if on_round is not None:
                on_round(metrics)
        return self.history

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        """Checkpoint the run to ``path`` as one unit: the store's part first (a disk store's new snapshot),
        then ``checkpoint.pt``, which names it, replaced atomically; only then are older snapshots removed. A
        failure at any step leaves the previous checkpoint whole and removes what this one wrote."""
        ck_dir = Path(path).parent
        clients = self.store.checkpoint(ck_dir, self.next_round)
        try:
            save_checkpoint(path, {"next_round": self.next_round, "server": self.server, "clients": clients,
                                   "history": self.history, "extra": extra or {},
                                   "train": asdict(self.run_info.train)}, record_hash=True)
        except BaseException:
            if not _names_snapshot(path, clients):  # a failure after checkpoint.pt was replaced keeps the snapshot
                self.store.discard(ck_dir, clients)
            raise
        self.store.commit(ck_dir, clients)

    def restore(self, path: str | Path, ck: dict | None = None) -> dict:
        """Continue from the checkpoint at ``path`` (or its already loaded contents ``ck``); returns its extra
        state."""
        ck = load_checkpoint(path) if ck is None else ck
        if self.run_info.device != "cpu":
            ck = to_device(ck, self.run_info.device)
        self.next_round = ck["next_round"]
        self.server = ck["server"]
        self.store.restore(ck["clients"], Path(path).parent)
        self.history = ck["history"]
        return ck.get("extra", {})


def _names_snapshot(path: str | Path, clients: Any) -> bool:
    """Whether the checkpoint at ``path`` names the disk snapshot ``clients`` (False for a memory store's)."""
    if not is_snapshot(clients):
        return False
    try:
        return load_checkpoint(path)["clients"].get(DISK_SNAPSHOT) == clients[DISK_SNAPSHOT]
    except Exception:  # missing, unreadable: it does not
        return False
