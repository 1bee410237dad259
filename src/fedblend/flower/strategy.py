"""A fedblend method's server half as a Flower ``Strategy``, for a Flower user's own ``ServerApp``.

::

    # my_app/server.py -- [tool.flwr.app.components] serverapp = "my_app.server:app"
    from flwr.serverapp import Grid, ServerApp
    from fedblend.flower import MethodStrategy

    class MyStrategy(MethodStrategy):                 # or MethodStrategy itself, composed in your own main
        def aggregate_train(self, server_round, replies):
            replies = [r for r in replies if keep(r)]    # your own server-side logic, then the method's
            arrays, metrics = super().aggregate_train(server_round, replies)
            return arrays, metrics                     # other arrays returned here become the global model

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context) -> None:
        strategy = MyStrategy("fedblend.toml", run_config=context.run_config)
        result = strategy.start(grid)                   # a flwr Result: final global model, metrics per round

The ClientApp runs the method's client half with :func:`fedblend.flower.client_handler` registered as the
``@app.train()``, ``@app.evaluate()`` and ``@app.query()`` handlers of your own ``ClientApp``
(examples/flower-strategy).

**Where each Strategy method runs.** :meth:`MethodStrategy.start` runs the engine's own round loop
(:func:`fedblend.experiment.run_experiment`: sampling, phases, the reply contract, the non-finite policy,
divergence, checkpoints, the results directory of ``fedblend run``) over Flower's ``Grid``, so a run's per-round
results equal ``fedblend run``'s for the same config and seed, bit for bit (one torch thread). Inside it, every
exchange of a round goes through this class:

* :meth:`configure_train` / :meth:`configure_evaluate` (Flower's signatures): the Flower messages of the exchange,
  one per node, carrying its clients' jobs; each job's message is the method's server half
  (``Method.configure`` per selected client for a training phase, ``Method.configure_evaluate`` for an
  evaluation), made by the engine, which holds it to the message channels before it is sent. ``arrays``: the
  current global model (empty for a method without one); ``config``: ``start``'s ``train_config`` /
  ``evaluate_config``, added to every job message's config (the client half reads ``msg.config``; the method's own
  entries win).
* :meth:`aggregate_train` (Flower's signature): the method's server half ``Method.aggregate`` over the replies
  that passed the engine's checks, one Flower message per client (:func:`client_reply` reads one; its metadata
  names the node that answered). Returns the new global model as an ``ArrayRecord`` (None for a method without
  one) and the server's round stats with the clients' ``num-examples`` as a ``MetricRecord``. Arrays other than
  the ones it returned become the global model (server-side logic such as server momentum); replies left out are
  not aggregated. :attr:`phase` names the exchange (``"train"`` for most methods; a method with several phases
  per round aggregates each); a method with a sequential server (FedAPA, pFedHN, pFedLA with
  ``options.sequential = true``) aggregates once per client.
* :meth:`aggregate_evaluate` (Flower's signature): once per evaluated round, the nodes' evaluation replies on the
  protocol's split pooled as the engine pools them (``acc``, ``loss``, the client mean and std, the global model's
  where the method has one). The run's metrics.jsonl is the engine's; this is what :meth:`start`'s ``Result``
  carries.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedblend.config import RunConfig
from fedblend.core.client import EVALUATE, ClientJob, ClientResult
from fedblend.core.evaluation import GLOBAL_PREFIX, EvalCounts, summarise
from fedblend.core.message import Message as FedMessage
from fedblend.core.method import Method, ServerCtx, State
from fedblend.flower import apps, blocks
from fedblend.flower.backend import FlowerBackend, FlowerRunError
from fedblend.flower.node import run_config_of
from fedblend.flower.wire import from_record, to_record, unpack

log = logging.getLogger("fedblend.flower")

__all__ = ["MethodStrategy", "client_reply"]

#: the scalars of a metrics row that are not the clients' training stats (the evaluation's, the round's)
EVAL_ROW = frozenset({"round", "seconds", "acc", "loss", "acc_client_mean", "acc_client_std"})


class MethodStrategy(Strategy):
    """Any registered fedblend method (plug-ins included) as a Flower ``Strategy`` (module docstring).

    ``config``: a fedblend run config (a TOML path, a dict, a :class:`~fedblend.config.RunConfig`; ``overrides``
    as ``fedblend run --set``); ``run_config``: the Flower run config (``context.run_config``: ``fedblend.*``
    keys override config fields, deployment options override the keyword arguments, as for
    :func:`fedblend.flower.server_app`). ``out``: the results directory (default ``runs/LABEL``); ``nodes``:
    SuperNodes to wait for; ``timeout``: seconds to wait for a node's answer; ``min_clients``, ``threads``,
    ``resume``, ``force``: as for :func:`~fedblend.flower.server_app`. Give the ClientApps the same ``config``
    (:func:`fedblend.flower.client_handler`)."""

    def __init__(self, config: str | Path | Mapping[str, Any] | RunConfig | None, *,
                 run_config: Mapping[str, Any] | None = None, overrides: list[str] | None = None,
                 out: str | Path = "", data_dir: str | Path = "", nodes: int = 1, timeout: float = 600.0,
                 min_clients: int = 1, threads: int = 1, resume: bool = False, force: bool = False):
        defaults = {"out": str(out), "data-dir": str(data_dir), "num-nodes": int(nodes), "timeout": float(timeout),
                    "min-clients": int(min_clients), "threads": int(threads), "resume": bool(resume),
                    "force": bool(force)}
        #: the run config of fedblend's generated app (:mod:`fedblend.flower.apps`): the fedblend config, resolved,
        #: and the deployment options
        self.run_config = blocks.run_config_for(blocks.raw_config(config, overrides), dict(run_config or {}),
                                                defaults)
        self.cfg: RunConfig = run_config_of(self.run_config)  #: the fedblend config the run runs
        self.out = Path(str(self.run_config["out"]))  #: its results directory
        self.train_config: dict[str, Any] = {}
        self.evaluate_config: dict[str, Any] = {}
        self.backend: StrategyBackend | None = None
        #: the exchange in progress: its phase, the method (the engine's), its server state and context
        self.phase: str = "train"
        self.method: Method | None = None
        self.server: State = {}
        self.sctx: ServerCtx | None = None
        self._jobs: tuple[list[ClientJob], dict[int, list[int]]] = ([], {})
        self._aggregated: State | None = None
        self._returned: ArrayRecord | None = None
        self._eval_replies: list[Message] = []
        self._evaluate_fn = None
        self.result = Result()

    # ------------------------------------------------------------------------------ Flower's Strategy API
    def summary(self) -> None:
        cfg = self.cfg
        log.info("fedblend %s: %s, model %s, %d clients, %d rounds, seed %d; results in %s", self.cfg.label,
                 cfg.dataset, cfg.model, cfg.partition.num_clients, cfg.rounds, cfg.seed, self.out)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """The Flower messages of a training exchange: one per node, its clients' jobs (module docstring)."""
        return self._messages(config)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The Flower messages of an evaluation exchange: one per node, its clients' jobs (module docstring)."""
        return self._messages(config)

    def aggregate_train(self, server_round: int,
                        replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The method's ``aggregate`` over ``replies`` (one per client, :func:`client_reply`): the new global
        model and the round's server stats (module docstring)."""
        if self.method is None or self.sctx is None:
            raise RuntimeError("aggregate_train runs inside MethodStrategy.start (the engine's round loop)")
        got = dict(client_reply(m) for m in replies)
        if not got:
            self._aggregated, self._returned = self.server, None
            return None, None
        device = self.sctx.run.device
        got = {cid: FedMessage(_to(m.arrays, device), m.metrics, m.config) for cid, m in sorted(got.items())}
        self._aggregated = super(type(self.method), self.method).aggregate(self.phase, self.server, got, self.sctx)
        glob = self.method.global_params(self._aggregated)
        self._returned = None if glob is None else ArrayRecord({k: v.detach().cpu() for k, v in glob.items()})
        stats = {k: v for k, v in self.sctx.stats.items() if _metric(v)}
        stats["num-examples"] = int(sum(int(m.metrics.get("num_samples", 0)) for m in got.values()))
        return self._returned, MetricRecord(stats)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The nodes' evaluation replies pooled as the engine pools them (module docstring)."""
        own = []
        for reply in replies:
            if reply.has_error() or "results" not in reply.content.array_records:
                continue
            results, _ = unpack(reply.content, "results")
            for r in results:
                if r.get("ok"):
                    own.append((int(r["cid"]), EvalCounts.from_metrics(r["reply"]["metrics"]),
                                EvalCounts.from_metrics(r["reply"]["metrics"], GLOBAL_PREFIX)))
        own = [x for x in sorted(own, key=lambda x: x[0]) if x[1] is not None]
        if not own:
            return None
        out = summarise([c for _, c, _ in own])
        if all(g is not None for _, _, g in own):
            out.update({f"global_{k}": v for k, v in summarise([g for _, _, g in own]).items()})
        out["clients"] = len(own)
        return MetricRecord({k: float(v) if isinstance(v, float) else v for k, v in out.items()})

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn=None) -> Result:
        """Run the method over ``grid``: the engine's round loop with this strategy's methods for each exchange
        (module docstring); writes the results directory (:attr:`out`) and returns a Flower ``Result``: the
        final global model (empty for a method without one), per round the clients' training stats, the pooled
        evaluation (:meth:`aggregate_evaluate`) and ``evaluate_fn(round, global arrays)`` (round 0: the initial
        model). ``initial_arrays``: not taken (the initial model is the config's: its seed, or its ``init``
        file, which the nodes build too); ``num_rounds``: the config's (set ``fedblend.rounds`` in the run config,
        which the ClientApps read too); ``timeout``: seconds to wait for a node's answer."""
        if initial_arrays is not None and len(initial_arrays):
            raise ValueError("MethodStrategy.start: the initial model is the fedblend config's (its seed, or the "
                             "weights file of its `init` field), which every node builds too: pass no "
                             "initial_arrays")
        if num_rounds is not None and int(num_rounds) != self.cfg.rounds:
            raise ValueError(f"MethodStrategy.start: num_rounds={num_rounds} but the fedblend config says rounds = "
                             f"{self.cfg.rounds}; set `fedblend.rounds` in the run config (the ClientApps read it "
                             f"too)")
        rc = dict(self.run_config)
        if timeout is not None:
            rc["timeout"] = float(timeout)
        self.train_config, self.evaluate_config = dict(train_config or {}), dict(evaluate_config or {})
        self._evaluate_fn, self.result = evaluate_fn, Result()
        log.info("Starting %s (fedblend %s)", type(self).__name__, self.cfg.label)
        self.summary()
        apps.serve(grid, rc, progress=self._round_done, backend_cls=partial(StrategyBackend, strategy=self),
                   method=lambda cfg: routed(cfg.build_method(), self))
        return self.result

    # ------------------------------------------------------------------------------------------ internals
    def global_arrays(self) -> ArrayRecord:
        """The current global model as an ``ArrayRecord`` (empty for a method without one)."""
        glob = None if self.method is None else self.method.global_params(self.server)
        return ArrayRecord({k: v.detach().cpu() for k, v in (glob or {}).items()})

    def _messages(self, config: Mapping[str, Any]) -> list[Message]:
        jobs, per = self._jobs
        return self.backend.messages(jobs, per, dict(config))

    def _aggregate(self, method: Method, phase: str, server: State, replies: Mapping[int, FedMessage],
                   sctx: ServerCtx) -> State:
        """The engine's ``aggregate`` call, through :meth:`aggregate_train` (module docstring)."""
        self.method, self.phase, self.server, self.sctx = method, phase, server, sctx
        self._aggregated = None
        sent = self.backend.sent
        msgs = [flower_reply(cid, phase, replies[cid], sent.get(self.backend.owner.get(cid))) for cid in sorted(replies)]
        arrays, _ = self.aggregate_train(sctx.rnd + 1, msgs)
        if self._aggregated is None:
            raise FlowerRunError(f"{type(self).__name__}.aggregate_train did not call MethodStrategy.aggregate_train "
                                 f"(super().aggregate_train), which runs the method's server half")
        new = self._aggregated
        if arrays is not None and arrays is not self._returned:
            new = self._adopt(new, arrays)
        self.server = new
        return new

    def _adopt(self, server: State, arrays: ArrayRecord) -> State:
        """``server`` with ``arrays`` (what an override of :meth:`aggregate_train` returned) as its global model."""
        if self.method.global_params(server) is None or self.method.global_params(server) is not server.get("global"):
            raise FlowerRunError(f"{self.method.label} keeps no global model under 'global': aggregate_train "
                                 f"cannot return arrays of its own")
        device = self.sctx.run.device
        new = {k: v.to(device) for k, v in arrays.to_torch_state_dict().items()}
        return {**server, "global": {**server["global"], **new}}

    def _round_done(self, metrics: dict, sim) -> None:
        """After each round (run_experiment's progress hook): the round's part of :attr:`result`."""
        rnd = int(metrics["round"])
        self.method, self.server = sim.method, sim.server
        train = {k: float(v) for k, v in metrics.items()
                 if _metric(v) and k not in EVAL_ROW and not k.startswith(("global_", "val_", "eval_"))}
        self.result.train_metrics_clientapp[rnd] = MetricRecord(train)
        replies, self._eval_replies = self._eval_replies, []
        if replies:
            agg = self.aggregate_evaluate(rnd, replies)
            if agg is not None:
                self.result.evaluate_metrics_clientapp[rnd] = agg
        self.result.arrays = self.global_arrays()
        if self._evaluate_fn is not None:
            res = self._evaluate_fn(rnd, self.result.arrays)
            if res is not None:
                self.result.evaluate_metrics_serverapp[rnd] = res


class StrategyBackend(FlowerBackend):
    """The Flower backend whose exchanges go through a :class:`MethodStrategy`: its ``configure_train`` /
    ``configure_evaluate`` make the messages; the evaluation replies on the protocol's split are kept for its
    ``aggregate_evaluate``."""

    def __init__(self, *args: Any, strategy: MethodStrategy, **kw: Any):
        super().__init__(*args, **kw)
        self.strategy = strategy
        self.sent: dict[int, Message] = {}  # the exchange's messages, by node
        strategy.backend = self

    def start(self, method, run, data, tree) -> None:
        super().start(method, run, data, tree)
        s = self.strategy
        s.method = method
        if s._evaluate_fn is not None:  # the initial model, before round 1
            res = s._evaluate_fn(0, ArrayRecord({k: v.detach().cpu() for k, v in run.init_params.items()}))
            if res is not None:
                s.result.evaluate_metrics_serverapp[0] = res

    def run(self, jobs) -> list[ClientResult | None]:
        if not jobs:
            return []
        self._greet()
        s = self.strategy
        per = self.per_node(jobs)
        s._jobs = (list(jobs), per)
        rnd = jobs[0].rnd + 1
        evaluating = all(j.phase == EVALUATE for j in jobs)
        if evaluating:
            msgs = list(s.configure_evaluate(rnd, s.global_arrays(), ConfigRecord(s.evaluate_config), self.grid))
        else:
            msgs = list(s.configure_train(rnd, s.global_arrays(), ConfigRecord(s.train_config), self.grid))
        dst = sorted(m.metadata.dst_node_id for m in msgs)
        if dst != sorted(per) or not all("jobs" in m.content.array_records for m in msgs):
            raise FlowerRunError(f"{type(s).__name__}.configure_{'evaluate' if evaluating else 'train'} must return "
                                 f"the messages of MethodStrategy's (one per node {sorted(per)}, each with its "
                                 f"'jobs'), got messages to nodes {dst}; change their config or metadata instead")
        self.sent = {m.metadata.dst_node_id: m for m in msgs}
        out = self.collect(jobs, per, msgs)
        if evaluating and jobs[0].msg.config.get("split") == s.cfg.eval.split:
            s._eval_replies += [self.replies[n] for n in per if n in self.replies]
        return out


def routed(method: Method, strategy: MethodStrategy) -> Method:
    """``method`` with its ``aggregate`` going through ``strategy`` (:meth:`MethodStrategy.aggregate_train`); all
    else is the method's own (a subclass made for this run, same name, options and traits)."""
    cls = type(method)
    sub = type(cls.__name__, (cls,), {"aggregate": _aggregate, "_strategy": strategy, "__module__": cls.__module__,
                                      "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    method.__class__ = sub
    return method


def _aggregate(self: Method, phase: str, server: State, replies: Mapping[int, FedMessage], sctx: ServerCtx) -> State:
    return type(self)._strategy._aggregate(self, phase, server, replies, sctx)


def flower_reply(cid: int, phase: str, reply: FedMessage, sent: Message | None) -> Message:
    """Client ``cid``'s checked reply as a Flower message: ``"reply"`` holds it (:func:`client_reply` reads it),
    ``"meta"`` its client id and phase; its metadata is a reply to the message ``sent`` to the client's node."""
    content = RecordDict({"reply": to_record({"arrays": reply.arrays, "metrics": reply.metrics,
                                              "config": reply.config}),
                          "meta": ConfigRecord({"cid": int(cid), "phase": phase})})
    if sent is None:
        return Message(content, dst_node_id=0, message_type=phase)
    return Message(content, reply_to=sent)


def client_reply(msg: Message) -> tuple[int, FedMessage]:
    """``(client id, its reply as a fedblend Message)`` of a reply :meth:`MethodStrategy.aggregate_train` gets."""
    rec = from_record(msg.content.array_records["reply"])
    return int(msg.content.config_records["meta"]["cid"]), FedMessage(rec["arrays"], rec["metrics"], rec["config"])


def _to(arrays: Any, device: str) -> Any:
    from fedblend.common.codec import to_device

    return arrays if device == "cpu" else to_device(arrays, device)


def _metric(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def result_json(result: Result) -> str:
    """A Flower ``Result``'s metrics as JSON (rounds as keys; the arrays left out): for a log or a test."""
    def records(d: Mapping[int, MetricRecord]) -> dict:
        return {str(k): dict(v) for k, v in sorted(d.items())}

    return json.dumps({"train": records(result.train_metrics_clientapp),
                       "evaluate": records(result.evaluate_metrics_clientapp),
                       "server": records(result.evaluate_metrics_serverapp),
                       "arrays": sorted(result.arrays.keys())}, sort_keys=True)

