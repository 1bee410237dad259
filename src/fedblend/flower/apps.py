"""The Flower app: a ``ServerApp`` running the method's server half and a ``ClientApp`` running its client half.

Both read the run config of the generated app (:func:`fedblend.flower.deploy.write_app`), whose keys are

* ``fedblend-config``: the resolved fedblend run config (JSON text) -- the same method, options and seed as
  ``fedblend run``;
* ``out``: the results directory on the SuperLink's machine (the run contract of :mod:`fedblend.experiment`:
  config.toml, partition.json, metrics.jsonl, summary.json, checkpoint.pt), ``resume`` / ``force`` as in
  ``fedblend run``;
* ``data-dir``: the dataset directory ("" = $FEDBLEND_DATA);
* ``num-nodes``: SuperNodes to wait for before round 1; ``wait-nodes``: seconds to wait for them to connect and
  to answer the greeting (default 300); ``timeout``: seconds to wait for a node's answer in an exchange;
  ``min-clients``: fewer answers stop the run; ``threads``: torch threads on the server and, unless a node's
  config says otherwise, on the nodes (1, as ``fedblend run --threads 1``, for equal results);
  ``poll``: seconds between the ServerApp's pulls of the replies (default 0.2; Flower's ``send_and_receive``
  waits 3 s between pulls); ``retries``: how often a message whose reply is a transient Flower error (a
  ClientApp that stopped responding, a lost reply) is sent again within ``timeout`` (default 1,
  :data:`fedblend.flower.backend.TRANSIENT`); ``keep``: state versions a node keeps per client (default
  enough for a resume, ``2 * checkpoint_every + 2``); ``state-dir``: the nodes' state directories' parent
  where a node config names none (:mod:`fedblend.flower.node`); ``error-file``: where the ServerApp writes the
  one line saying why it stopped, if it fails (``fedblend deploy`` reads it for its error; default none).

The ServerApp is :func:`fedblend.experiment.run_experiment` with the :class:`~fedblend.flower.backend.
FlowerBackend`: the engine's one round loop, its sampling and every random stream from the config's seed (never
from Flower's node order), so the accuracies equal ``fedblend run``'s for the same config and seed.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedblend.config import RUNTIME_ONLY
from fedblend.flower.node import Node, run_config_of
from fedblend.flower.wire import content, unpack

server_app = ServerApp()
client_app = ClientApp()


def run_key(resolved: dict, out: str | Path) -> str:
    """Names one run's states on the nodes: the config (less ``rounds``, which may grow on resume, and the
    runtime-only fields) and the results directory. A resumed run has the same key."""
    ident = {k: v for k, v in resolved.items() if k not in ("rounds", *RUNTIME_ONLY)}
    blob = json.dumps([ident, str(Path(out).resolve())], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    serve(grid, dict(context.run_config))


def serve(grid: Grid, rc: dict, progress=None, echo: bool = True, stop=None, backend_cls=None, method=None) -> dict:
    """Run the method's server half over ``grid`` with the run config ``rc`` (keys: the module docstring's);
    returns the run's summary. The body of every fedblend ``ServerApp`` (also :mod:`fedblend.flower.blocks` and
    the simulation, :mod:`fedblend.flower.sim`, which passes its round display as ``progress`` and prints the
    summary itself, ``echo=False``, and a ``stop`` event that ends the run's waits on Ctrl-C).
    :class:`fedblend.flower.strategy.MethodStrategy` passes its own ``backend_cls`` (a
    :class:`~fedblend.flower.backend.FlowerBackend` class or factory) and ``method`` (the config -> the method
    the engine runs, its server half routed through the strategy)."""
    from fedblend.experiment import run_experiment
    from fedblend.flower.backend import FlowerBackend

    _log_to_stderr()
    cfg = run_config_of(rc)
    out = Path(str(rc["out"]))
    torch.set_num_threads(int(rc.get("threads", 1)))
    keep = int(rc.get("keep", max(2, 2 * cfg.checkpoint_every + 2)))  # state versions per client (a resume)
    backend = (backend_cls or FlowerBackend)(grid, run_key(cfg.resolved(), out), nodes=int(rc.get("num-nodes", 1)),
                            timeout=float(rc.get("timeout", 600)), min_clients=int(rc.get("min-clients", 1)),
                            keep=keep, poll=float(rc.get("poll", 0.2)), stop=stop,
                            wait_nodes=float(rc.get("wait-nodes", 300)), retries=int(rc.get("retries", 1)))
    try:
        summary = run_experiment(cfg, out, str(rc.get("data-dir") or "") or None,
                                 resume=bool(rc.get("resume", False)), force=bool(rc.get("force", False)),
                                 backend=backend, progress=progress,
                                 method=None if method is None else method(cfg))
    except BaseException as exc:
        record_error(exc, str(rc.get("error-file") or ""))
        raise
    keys = ("status", "method", "seed", "rounds", "best_accuracy", "final_accuracy", "seconds_per_round")
    if echo:
        print(json.dumps({k: summary.get(k) for k in keys}), flush=True)
    return summary


ERROR_MARK = "[fedblend] ServerApp error: "  # heads the one line saying why the ServerApp stopped


def record_error(exc: BaseException, error_file: str = "") -> None:
    """Why the ServerApp stopped, as one line: on stderr (which ``flwr run --stream`` shows) and, when the run
    config names an ``error-file`` (``fedblend deploy`` does, in its work folder), in that file, so that the
    command's error line gives the cause instead of a process's exit code."""
    import sys

    line = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]
    print(ERROR_MARK + line, file=sys.stderr, flush=True)
    if error_file:
        try:
            Path(error_file).write_text(line + "\n")
        except OSError:
            pass  # the stderr line is still there


def _log_to_stderr() -> None:
    """The ServerApp process's ``fedblend`` log records (nodes joining, faults) on stderr, which Flower streams
    (``flwr run --stream``) and ``fedblend deploy`` keeps in ``flwr-run.log``."""
    import logging
    import sys

    log = logging.getLogger("fedblend")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


_NODES: dict[str, Node] = {}  # per process (a ClientApp process may answer several messages)


def process_age() -> float | None:
    """Seconds since this process started (Linux ``/proc``; None elsewhere): at the first line of fedblend's
    handler, what the interpreter, the imports (flwr, torch, fedblend) and Flower's setup cost."""
    import os

    try:
        start_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 3)


def _node(msg: Message, context: Context, run_config: dict | None) -> tuple[Node, dict]:
    _, meta = unpack(msg.content, "jobs" if "jobs" in msg.content.array_records else "hello")
    key = f"{meta['run_key']}/{context.node_id}"
    if key not in _NODES:
        rc = dict(context.run_config) if run_config is None else run_config
        _NODES[key] = Node(rc, dict(context.node_config), str(meta["run_key"]))
    return _NODES[key], meta


def answer(msg: Message, context: Context, run_config: dict | None = None, states=None) -> Message:
    """The node's reply to a server message (greeting or job batch); an error reply if the node cannot serve.
    ``run_config``: the run config to use instead of the context's (:mod:`fedblend.flower.blocks`); ``states``:
    where the clients' states live (default the node's state directory; the simulation keeps them in the
    context). A job batch's reply carries its timings (``process_age`` at entry, ``node_load``, ``work``;
    seconds)."""
    try:
        age = process_age()
        t0 = time.perf_counter()
        node, meta = _node(msg, context, run_config)
        if "hello" in msg.content.array_records:
            return Message(content("hello", node.hello()), reply_to=msg)
        t1 = time.perf_counter()
        jobs, _ = unpack(msg.content, "jobs")
        results = node.handle(jobs, int(meta.get("keep", 2)), states)
        timing = {"node_load": round(t1 - t0, 4), "work": round(time.perf_counter() - t1, 4)}
        if age is not None:
            timing["process_age"] = age
        return Message(content("results", results, **timing), reply_to=msg)
    except Exception as exc:  # noqa: BLE001 - the server records it and goes on without this node
        return Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)


@client_app.query()
def client_query(msg: Message, context: Context) -> Message:
    return answer(msg, context)


@client_app.train()
def client_train(msg: Message, context: Context) -> Message:
    return answer(msg, context)


@client_app.evaluate()
def client_evaluate(msg: Message, context: Context) -> Message:
    return answer(msg, context)
