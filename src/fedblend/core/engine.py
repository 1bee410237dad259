"""The round engine: the one loop every method runs in (the in-process runtime of the method interface).

Per round ``t`` (0-based internally, reported 1-based):

1. sample the joining clients (:mod:`fedblend.core.sampling`);
2. for each phase of the round (``method.phases``, one ``"train"`` exchange by default): the server half
   ``configure``s a message per joining client, the backend runs the client halves on them (each with its own
   state, initialised on the client at first contact), the new client states are stored and the server half
   ``aggregate``s the replies;
   Before aggregation every training reply is held to the reply contract (:mod:`fedblend.core.replies`: a
   Message, model parameters of the model's shapes and a floating dtype, no names the model lacks, a positive
   ``num_samples``; :class:`~fedblend.common.errors.MessageError` names the method, client, round and entry).
   Then every tensor of every reply *and of the client's new state* (what it keeps and never
   uploads, e.g. Ditto's personalized model) is checked: NaN / inf stops the run
   (:class:`~fedblend.common.errors.NonFiniteError`, ``on_nonfinite = "stop"``) or is dropped with the client's
   new state and stats (``"skip"``: the aggregate is over the other clients; ``nonfinite_clients`` in metrics);
   a client with no result (``None`` from a backend that tolerates faults, e.g. Flower's: node down, timeout,
   refused reply) is left out the same way (``dropped_clients``; ``eval_missing`` in evaluation), and a
   backend's ``report()`` is merged into the round's metrics;
3. every ``eval.every`` rounds (and at the last), every client evaluates its personalized model (the one
   ``eval.model`` names, ``Method.eval_choices``; and the global model, if the method has one) from an
   evaluation message, through the backend as well (with
   ``eval.select = "val"`` also on its validation split, as ``val_*`` metrics);
4. record metrics (accuracy, loss, bytes down/up per client, seconds; the clients' stats as their mean over the
   selected clients, and their losses (``train_loss``, every ``*_loss``) and the stats the method names in
   ``per_client_stats`` also per client, ``stats_per_client``)
   and checkpoint every ``k`` rounds.

**Divergence is never a result.** After each round the engine checks for divergence (:meth:`Simulation.diverging`):
NaN / inf in the server state after aggregation, in a training client's reported losses (``train_loss``,
``personal_loss``, ...) or in an evaluation loss (a personalized or global model that is NaN), every reply of a
phase skipped as non-finite, or a finite explosion of a loss: a client training loss or an evaluation loss above
``divergence_factor x max(ln C, L1)`` (``C`` classes, ``L1`` that loss's first recorded value in the run; until
there is one, ``divergence_factor x ln C``). The round's metrics then carry ``"diverged": reason``;
``on_divergence = "stop"`` raises :class:`~fedblend.common.errors.DivergedError` after the round, ``"warn"`` warns
once and goes on (the run is still reported as diverged at its end, :mod:`fedblend.experiment`). NaN / inf in a
client's reply or new state is caught earlier, before aggregation (``on_nonfinite``).

The engine holds the server state and the client-state store; only messages and each client's own state reach
a client half, so the same method runs unchanged in worker processes or on Flower nodes.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import to_device
from fedblend.common.errors import DivergedError, MessageError, NonFiniteError
from fedblend.common.guard import check_returned, method_guard, returned_wrong
from fedblend.common.rng import SeedTree
from fedblend.core.backend import Backend
from fedblend.core.backends import SequentialBackend
from fedblend.core.checkpoint import FILENAME, load_checkpoint, save_checkpoint
from fedblend.core.client import EVALUATE, ClientJob, ClientResult, ClientRuntime
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalCounts, EvalProtocol, per_client_counts, summarise
from fedblend.core.message import Message, channel_errors, first_nonfinite, first_nonfinite_value
from fedblend.core.method import BEFORE_AFTER, ClientCtx, Method, RunInfo, ServerCtx, State, server_tree
from fedblend.core.replies import check_is_message, check_reply, model_errors, reply_errors
from fedblend.core.sampling import SamplingConfig, sample_clients
from fedblend.core.state import DISK_SNAPSHOT, ClientStore, is_snapshot
from fedblend.core.training import TrainConfig
from fedblend.data.federated import FederatedData
from fedblend.models.zoo import initial_model, model_params

EVAL_LOSSES = ("loss", "global_loss", "val_loss", "val_global_loss")  # held to the divergence bound
LOSS_NAMES = {"loss": "the personalized models' test loss", "global_loss": "the global model's test loss",
              "val_loss": "the personalized models' validation loss",
              "val_global_loss": "the global model's validation loss"}
EVAL_CHUNK = 64  # evaluation messages built and run per batch of clients (bounds memory with many clients)


@dataclass
class Simulation:
    """A run in progress: the public run facts, explicit mutable state (server, client store, history)."""

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
            server = check_returned(method.init_server(sim.sctx(0)), dict, "the server state (a dict)", method,
                                    "method", "init_server")
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

    def _run_jobs(self, jobs: list[ClientJob]) -> list[ClientResult]:
        """Each job's result (None: no reply), messages and states held on the run's device both ways
        (:func:`~fedblend.common.codec.to_device`: a no-op where everything is there already)."""
        if not self._started:
            self.backend.start(self.method, self.run_info, dict(enumerate(self.fed.clients)), self.tree)
            self._started = True
        device = self.run_info.device
        for job in jobs:
            job.msg.arrays = to_device(job.msg.arrays, device)
        hook = self.on_client
        if hook is None:
            results = self.backend.run(jobs)
        else:
            self.backend.on_result = lambda job: hook("done", job.cid)  # each job as its result is in
            try:
                results = self.backend.run(jobs)
            finally:
                self.backend.on_result = None
        for job, res in zip(jobs, results):
            if res is not None:
                check_is_message(res.reply, self.method.label, job.cid, job.rnd, job.phase)
                res.reply.arrays, res.state = to_device(res.reply.arrays, device), to_device(res.state, device)
        return results

    def _check_channels(self, msg: Message, phase: str, cid: int, reply: bool, stats: dict | None = None) -> None:
        """Refuse a message that breaks the channel rules (:func:`~fedblend.core.message.channel_errors`), and
        client stats that are not plain numbers (they are averaged into the round's metrics)."""
        errors = channel_errors(msg, reply)
        errors += [f"stats[{k!r}] is a {type(v).__name__}: client stats are numbers (averaged over the round's "
                   f"clients)" for k, v in (stats or {}).items()
                   if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)))]
        if errors:
            what = f"client {cid}'s {phase} reply" if reply else f"the server's {phase} message to client {cid}"
            raise MessageError(f"{self.method.label}: {what} breaks the message channels:\n  " + "\n  ".join(errors))

    def _check_sent(self, msg: Message, hook: str, cid: int, t: int) -> None:
        """Refuse a message of the server half whose parameter records break the reply contract's rules for
        parameters (:mod:`fedblend.core.replies`: a model parameter's name, shape, floating dtype): named as the
        ``hook`` that made it, not as the client's training failing on it."""
        traits = self.method.traits
        bad = [e for e in reply_errors(msg, self.run_info.init_params, traits.param_records, traits.extra_entries)
               if not e.startswith("metrics[")]
        if bad:
            returned_wrong(self.method, "method", hook, "a message that does not fit the model (" + "; ".join(bad)
                           + ")", t, cid)

    def _check_reply(self, reply: Message, phase: str, cid: int, t: int) -> None:
        """Refuse a training reply that breaks the reply contract (:mod:`fedblend.core.replies`): parameters of the
        wrong shape or dtype, names the model does not have, a ``num_samples`` that is no positive number."""
        traits = self.method.traits
        check_reply(reply, self.method.label, cid, t, phase, self.run_info.init_params, traits.param_records,
                    traits.extra_entries, self.fed.clients[cid].num_train)

    def _checked_server(self, server: State, hook: str, t: int | None) -> State:
        """``server`` (what the method's ``hook`` returned), refused where its global model (where the method has
        one) is not a whole model of the run's names, shapes and floating dtypes: a shape or name that is off
        would reach every client (or fill in from the initial weights) instead of being named where it is made."""
        with method_guard(self.method, hook, t):
            glob = self.method.global_params(server)
        bad = [] if glob is None else model_errors(glob, self.run_info.init_params)
        if bad:
            returned_wrong(self.method, "method", hook, "a server state whose global model is not the model's ("
                           + "; ".join(bad) + ")", t)
        return server

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
        t = self.next_round
        sctx = self.sctx(t)
        t0 = time.perf_counter()
        selected = sample_clients(self.sampling, self.fed.num_clients, t, self.tree)
        stats: dict[int, dict] = {cid: {} for cid in selected}
        down = dict.fromkeys(selected, 0)
        up = dict.fromkeys(selected, 0)
        skipped: list[int] = []
        dropped: list[int] = []  # no reply (a backend that tolerates faults returns None for them)
        self._alarms = []

        def exchange(phase: str, cids: list[int]) -> dict[int, Message]:
            msgs = {}
            for cid in cids:
                with method_guard(self.method, "configure", t, cid):
                    msgs[cid] = check_returned(self.method.configure(phase, self.server, cid, sctx), Message,
                                               "a Message", self.method, "method", "configure", t, cid)
            if self.protocol.before_after:
                for m in msgs.values():
                    m.config[BEFORE_AFTER] = self.protocol.split
            for cid in cids:
                self._check_channels(msgs[cid], phase, cid, reply=False)
                self._check_sent(msgs[cid], "configure", cid, t)
            results = self._run_jobs([ClientJob(phase, cid, t, msgs[cid], self.store.get(cid)) for cid in cids])
            replies = {}
            for cid, res in zip(cids, results):
                down[cid] += msgs[cid].num_bytes
                if res is None:  # the client did not answer (node down, timeout, refused reply)
                    dropped.append(cid)
                    continue
                self._check_channels(res.reply, phase, cid, reply=True, stats=res.stats)
                self._check_reply(res.reply, phase, cid, t)
                up[cid] += res.reply.num_bytes
                answered[phase] = answered.get(phase, 0) + 1
                if self._nonfinite(res, cid, phase, t):
                    skipped.append(cid)
                    refused[phase] = refused.get(phase, 0) + 1
                    continue
                self.store.put(cid, res.state)
                stats[cid].update(res.stats)
                replies[cid] = res.reply
            return replies

        def aggregate(phase: str, replies: dict[int, Message]) -> None:
            if replies:  # every reply skipped as non-finite: the server keeps its state
                with method_guard(self.method, "aggregate", t):
                    server = check_returned(self.method.aggregate(phase, self.server, replies, sctx), dict,
                                            "the new server state (a dict)", self.method, "method", "aggregate", t)
                self.server = to_device(self._checked_server(server, "aggregate", t), self.run_info.device)

        answered: dict[str, int] = {}  # replies received per phase
        refused: dict[str, int] = {}  # of them skipped as non-finite

        with method_guard(self.method, "phases", t):
            phases = self.method.phases(sctx)
            if not (isinstance(phases, (list, tuple)) and phases and all(isinstance(p, str) for p in phases)):
                check_returned(phases, (), "a non-empty tuple of phase names", self.method, "method", "phases", t)
        if self.on_client is not None:
            self.on_client("train", len(selected) * len(phases))
        active = list(selected)  # a later phase goes to the clients whose reply the phase before accepted
        for phase in phases:
            accepted: list[int] = []
            if self.method.traits.sequential_server:
                for cid in active:
                    replies = exchange(phase, [cid])
                    aggregate(phase, replies)
                    accepted += list(replies)
            else:
                replies = exchange(phase, active)
                aggregate(phase, replies)
                accepted = list(replies)
            where = first_nonfinite_value(self.server)  # once per phase (a sequential server aggregates per client)
            if where is not None:
                self._alarms.append(f"the server state has NaN or inf values after aggregating the {phase} phase "
                                    f"(in {where})")
                break
            if answered.get(phase) and refused.get(phase) == answered[phase]:
                self._alarms.append(f"every {phase} update of the round ({answered[phase]}) was skipped as "
                                    f"non-finite (on_nonfinite = 'skip'): nothing was aggregated")
                break  # the round's later phases have nothing to build on
            active = [c for c in active if c in set(accepted)]
            if not active:
                break
        train_seconds = time.perf_counter() - t0
        self._loss_keys = sorted({k for c in selected for k in stats[c] if k.endswith("_loss")} | {"train_loss"})
        for c in selected:
            bad = [k for k in self._loss_keys if isinstance(stats[c].get(k), float) and not math.isfinite(stats[c][k])]
            if bad and self.fed.clients[c].num_train > 0:
                self._alarms.append(f"client {c}'s {bad[0]} is {stats[c][bad[0]]}")
                break
        metrics: dict[str, Any] = {
            "round": t + 1,
            "selected": selected,
            "bytes_down": [down[c] for c in selected],
            "bytes_up": [up[c] for c in selected],
            "train_loss": _mean([stats[c].get("train_loss") for c in selected]),
            "seconds": train_seconds,
        }
        pooled, consumed = _pool_counts([stats[c] for c in selected])
        metrics.update(pooled)
        for key in sorted({k for c in selected for k in stats[c]} - {"train_loss"} - consumed):
            metrics[key] = _mean([stats[c].get(key) for c in selected])
        metrics.update(sctx.stats)
        metrics.update(_time_shares([stats[c] for c in selected]))
        per_client = _stats_per_client(selected, stats, tuple(self._loss_keys) + self.method.traits.per_client_stats)
        if per_client:
            metrics["stats_per_client"] = per_client
        if skipped:
            metrics["nonfinite_clients"] = sorted(set(skipped))
        if dropped:
            metrics["dropped_clients"] = sorted(set(dropped))
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

    # ------------------------------------------------------------------------------------------- divergence
    def loss_bound(self, key: str, rnd: int) -> float:
        """The value of loss ``key`` (a metrics column) above which round ``rnd`` (1-based) counts as diverged:
        ``divergence_factor x max(ln C, L1)``, ``L1`` the first finite value of ``key`` recorded before round
        ``rnd`` (none yet: ``ln C``, the cross-entropy of a uniform guess over the ``C`` classes)."""
        ref = math.log(max(2, int(self.fed.info.get("num_classes", 2))))
        first = next((m[key] for m in self.history if m["round"] < rnd
                      and isinstance(m.get(key), float) and math.isfinite(m[key])), None)
        return self.divergence_factor * max(ref, first if first is not None else ref)

    def diverging(self, metrics: dict) -> str | None:
        """Check the round just recorded (``metrics``, with this round's findings) for divergence; on one, mark
        the row ``"diverged"`` and stop (``on_divergence = "stop"``: :class:`DivergedError`) or warn once
        (``"warn"``). Returns the reason, or None.

        The losses held to the bound (:meth:`loss_bound`): the clients' training losses (``train_loss`` and every
        other ``*_loss`` clients report, e.g. Ditto's ``personal_loss``) and the evaluation losses (``loss``,
        ``global_loss`` and their ``val_`` twins); not the server's own (an agent's or autoencoder's)."""
        alarms = list(self._alarms)
        for key in [*self._loss_keys, *EVAL_LOSSES]:
            loss = metrics.get(key)
            if isinstance(loss, float) and math.isfinite(loss) and loss > self.loss_bound(key, metrics["round"]):
                what = LOSS_NAMES.get(key, f"the clients' mean {key}")
                alarms.append(f"{what} {loss:.4g} exceeds the divergence bound "
                              f"{self.loss_bound(key, metrics['round']):.4g} (divergence_factor "
                              f"{self.divergence_factor:g} x max(ln classes, its first value))")
                break
        self._alarms = []
        if not alarms:
            return None
        reason = "; ".join(alarms)
        metrics["diverged"] = reason
        rnd = metrics["round"]
        first = self.diverged is None
        if first:
            self.diverged = {"round": rnd, "reason": reason}
        fix = ("lower train.lr or the method's step sizes / regularisation weights, check the data; "
               "divergence_factor sets the loss bound, on_divergence = 'warn' lets such a run go on")
        if self.on_divergence == "stop":
            raise DivergedError(f"round {rnd}: the run diverged: {reason}. It stopped (on_divergence = 'stop'): "
                                f"{fix}", rnd, reason)
        if first:
            warnings.warn(f"round {rnd}: the run diverged: {reason}; it goes on (on_divergence = 'warn') but will "
                          f"be reported as diverged", RuntimeWarning, stacklevel=2)
        return reason

    def _nonfinite(self, res: ClientResult, cid: int, phase: str, t: int) -> bool:
        """Whether client ``cid``'s reply or new state holds NaN / inf and is to be skipped; raises under
        ``"stop"``."""
        reply = res.reply
        where = first_nonfinite(reply.arrays)
        what = "update"
        if where is None:
            where, what = first_nonfinite_value(res.state), "state (kept on the client)"
        if where is None:
            return False
        if self.on_nonfinite == "stop":
            raise NonFiniteError(
                f"round {t + 1}: client {cid}'s {phase} {what} has NaN or inf values (in {where}); the run stopped "
                f"before aggregating it (on_nonfinite = 'stop'). Lower train.lr, check the client's data, or set "
                f"on_nonfinite = 'skip' to drop such updates", t + 1, cid, where)
        return True

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
                    msg = check_returned(self.method.configure_evaluate(self.server, cid, sctx), Message, "a Message",
                                         self.method, "method", "configure_evaluate", t, cid)
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




def _time_shares(stats: list[dict]) -> dict[str, float]:
    """For every per-client timing ``X_seconds`` a method or transform reports (e.g. ALA's ``ala_seconds``),
    ``X_share``: its sum over the round's clients divided by their summed ``client_seconds`` (the whole client
    update), i.e. the part of the round's client work spent in X."""
    total = sum(s.get("client_seconds", 0.0) for s in stats)
    keys = sorted({k for s in stats for k in s if k.endswith("_seconds") and k != "client_seconds"})
    if total <= 0:
        return {}
    return {k[: -len("_seconds")] + "_share": sum(float(s.get(k) or 0.0) for s in stats) / total for k in keys}


def _pool_counts(stats: list[dict]) -> tuple[dict[str, float], set[str]]:
    """Per-client counts ``X_correct`` / ``X_n`` pooled into ``X_acc = sum correct / sum n`` over the round's
    clients (e.g. the before / after local training scores); returns the values and the keys consumed."""
    tags = sorted({k[: -len("_correct")] for s in stats for k in s if k.endswith("_correct")})
    values, keys = {}, set()
    for t in tags:
        n = sum(int(s.get(f"{t}_n", 0)) for s in stats)
        values[f"{t}_acc"] = sum(int(s.get(f"{t}_correct", 0)) for s in stats) / n if n else float("nan")
        keys |= {f"{t}_correct", f"{t}_n"}
    return values, keys


def _stats_per_client(selected: list[int], stats: dict[int, dict], prefixes: tuple[str, ...]) -> dict:
    """The client stats whose key starts with one of ``prefixes``, per client: ``{"clients": [id, ...], key:
    [value, ...]}`` over the selected clients that reported any of them (None where a client did not report a
    key); ``{}`` when none did."""
    if not prefixes:
        return {}
    keys = sorted({k for c in selected for k in stats[c] if k.startswith(prefixes)})
    cids = [c for c in selected if any(k in stats[c] for k in keys)]
    if not cids:
        return {}
    return {"clients": [int(c) for c in cids],
            **{k: [None if stats[c].get(k) is None else float(stats[c][k]) for c in cids] for k in keys}}


def _mean(values: list) -> float:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else float("nan")

