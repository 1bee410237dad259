"""The round engine: the one loop every method runs in.

Per round ``t`` (0-based internally, reported 1-based):

1. sample the joining clients (:mod:`fedblend.core.sampling`);
2. ``downlink`` each its payload, run ``client_update`` through the backend, store the new client states;
3. ``aggregate`` the uploads on the server;
4. every ``eval.every`` rounds (and at the last), evaluate every client's personalized model (``eval_params``)
   and, if the method has one, the global model, on each client's test (or validation) data;
5. record metrics (accuracy, loss, bytes down/up per client, seconds) and checkpoint every ``k`` rounds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedblend.common.rng import SeedTree
from fedblend.core.backends import SequentialBackend
from fedblend.core.checkpoint import FILENAME, load_checkpoint, save_checkpoint
from fedblend.core.evaluation import EvalProtocol, evaluate_params, summarise
from fedblend.core.method import ClientCtx, Method, Setup, State, comm_bytes
from fedblend.core.sampling import SamplingConfig, sample_clients
from fedblend.core.state import ClientStore
from fedblend.core.training import TrainConfig
from fedblend.data.federated import FederatedData
from fedblend.models.zoo import build_model, model_params


@dataclass
class Simulation:
    """A run in progress: fixed setup, explicit mutable state (server, client store, history)."""

    method: Method
    fed: FederatedData
    setup: Setup
    sampling: SamplingConfig
    protocol: EvalProtocol
    server: State
    store: ClientStore
    history: list[dict] = field(default_factory=list)
    next_round: int = 0
    backend: Any = field(default_factory=SequentialBackend)

    # ------------------------------------------------------------------------------------------- setup
    @classmethod
    def create(cls, method: Method, fed: FederatedData, model_name: str, train: TrainConfig, rounds: int,
               seed: int, sampling: SamplingConfig | None = None, protocol: EvalProtocol | None = None,
               backend: Any = None) -> Simulation:
        tree = SeedTree(seed)
        model = build_model(model_name, fed.info, tree.torch("model-init"))
        model.requires_grad_(False)
        setup = Setup(model=model, init_params=model_params(model), train=train, num_clients=fed.num_clients,
                      num_samples=[c.num_train for c in fed.clients], rounds=rounds, tree=tree)
        store = ClientStore(lambda cid: method.init_client(cid, setup))
        return cls(method, fed, setup, sampling or SamplingConfig(), protocol or EvalProtocol(),
                   method.init_server(setup), store, backend=backend or SequentialBackend())

    def ctx(self, cid: int, rnd: int, purpose: str = "train") -> ClientCtx:
        return ClientCtx(cid, rnd, self.fed.clients[cid], self.setup,
                         self.setup.tree.child(purpose, "round", rnd, "client", cid))

    # ------------------------------------------------------------------------------------------- one round
    def run_round(self) -> dict:
        t = self.next_round
        self.setup.rnd = t
        t0 = time.perf_counter()
        selected = sample_clients(self.sampling, self.fed.num_clients, t, self.setup.tree)
        ctxs = {cid: self.ctx(cid, t) for cid in selected}
        payloads, uploads = {}, {}
        if self.method.sequential_server:
            for cid in selected:
                payloads[cid] = self.method.downlink(self.server, cid, self.setup)
                uploads[cid], cstate = self._client_update(payloads[cid], self.store.get(cid), ctxs[cid])
                self.store.put(cid, cstate)
                self.server = self.method.aggregate(self.server, {cid: uploads[cid]}, self.setup)
        else:
            payloads = {cid: self.method.downlink(self.server, cid, self.setup) for cid in selected}
            jobs = [(payloads[cid], self.store.get(cid), ctxs[cid]) for cid in selected]
            results = self.backend.run(self._client_update, jobs)
            for cid, (upload, cstate) in zip(selected, results):
                self.store.put(cid, cstate)
                uploads[cid] = upload
            self.server = self.method.aggregate(self.server, uploads, self.setup)
        train_seconds = time.perf_counter() - t0
        metrics: dict[str, Any] = {
            "round": t + 1,
            "selected": selected,
            "bytes_down": [comm_bytes(payloads[c]) for c in selected],
            "bytes_up": [comm_bytes(uploads[c]) for c in selected],
            "train_loss": _mean([ctxs[c].stats.get("train_loss") for c in selected]),
            "seconds": train_seconds,
        }
        for key in sorted({k for c in selected for k in ctxs[c].stats} - {"train_loss"}):
            metrics[key] = _mean([ctxs[c].stats.get(key) for c in selected])
        metrics.update(_time_shares([ctxs[c].stats for c in selected]))
        last = t + 1 == self.setup.rounds
        if (t + 1) % max(1, self.protocol.every) == 0 or last:
            e0 = time.perf_counter()
            metrics.update(self.evaluate(t))
            metrics["eval_seconds"] = time.perf_counter() - e0
        self.history.append(metrics)
        self.next_round = t + 1
        return metrics

    def _client_update(self, payload, cstate, ctx: ClientCtx):
        """``method.client_update``, timed: ``client_seconds`` in the client's stats."""
        t0 = time.perf_counter()
        out = self.method.client_update(payload, cstate, ctx)
        ctx.stats["client_seconds"] = time.perf_counter() - t0
        return out

    @torch.no_grad()
    def evaluate(self, t: int) -> dict:
        """Personalized (and global) accuracy over all clients, per :class:`EvalProtocol`."""
        split = self.protocol.split
        personal, glob = [], []
        gparams = self.method.global_params(self.server)
        for cid in range(self.fed.num_clients):
            data = self.fed.clients[cid]
            x, y = (data.test_x, data.test_y) if split == "test" else (data.val_x, data.val_y)
            with torch.enable_grad():  # methods may fine-tune or blend before evaluating
                params = self.method.eval_params(self.server, self.store.get(cid), self.ctx(cid, t, "eval"))
            res = evaluate_params(self.setup.model, params, x, y, self.protocol.batch_size)
            personal.append(res)
            if gparams is not None:
                glob.append(res if params is gparams else
                            evaluate_params(self.setup.model, gparams, x, y, self.protocol.batch_size))
        out = summarise(personal)
        if glob:
            out.update({f"global_{k}": v for k, v in summarise(glob).items()})
        return out

    # ------------------------------------------------------------------------------------------- the loop
    def run(self, on_round: Callable[[dict], None] | None = None, checkpoint_dir: str | Path | None = None,
            checkpoint_every: int = 0, extra_state: dict | None = None) -> list[dict]:
        while self.next_round < self.setup.rounds:
            metrics = self.run_round()
            if checkpoint_dir is not None and checkpoint_every > 0 and (
                    self.next_round % checkpoint_every == 0 or self.next_round == self.setup.rounds):
                self.save(Path(checkpoint_dir) / FILENAME, extra_state)
            if on_round is not None:
                on_round(metrics)
        return self.history

    def save(self, path: str | Path, extra: dict | None = None) -> None:
        save_checkpoint(path, {"next_round": self.next_round, "server": self.server, "clients": self.store.states,
                               "history": self.history, "extra": extra or {},
                               "train": asdict(self.setup.train)})

    def restore(self, path: str | Path) -> dict:
        ck = load_checkpoint(path)
        self.next_round = ck["next_round"]
        self.server = ck["server"]
        self.store.states = ck["clients"]
        self.history = ck["history"]
        return ck.get("extra", {})


def _time_shares(stats: list[dict]) -> dict[str, float]:
    """For every per-client timing ``X_seconds`` a method or transform reports (e.g. ALA's ``ala_seconds``),
    ``X_share``: its sum over the round's clients divided by their summed ``client_seconds`` (the whole client
    update), i.e. the part of the round's client work spent in X."""
    total = sum(s.get("client_seconds", 0.0) for s in stats)
    keys = sorted({k for s in stats for k in s if k.endswith("_seconds") and k != "client_seconds"})
    if total <= 0:
        return {}
    return {k[: -len("_seconds")] + "_share": sum(float(s.get(k) or 0.0) for s in stats) / total for k in keys}


def _mean(values: list) -> float:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else float("nan")
