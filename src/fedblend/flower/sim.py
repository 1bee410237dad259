"""``backend = "flower-sim"``: a run on Flower's Simulation Engine, its ClientApps in long-lived Ray actors.

Issue #24, "Simulation on Flower's Simulation Engine (Ray backend)": the same config as ``fedblend run``, with
the same per-round results bit for bit, run by ``flwr.simulation.run_simulation`` (Flower 1.41,
``pip install 'fedblend[simulation]'``):

* the **ServerApp** is the deployment's (:func:`fedblend.flower.apps.serve`: the engine's one round loop over
  Flower's ``Grid`` with the :class:`~fedblend.flower.backend.FlowerBackend`), run by Flower in a thread of this
  process and writing the usual results directory;
* the **ClientApp** is the deployment's node code (:func:`fedblend.flower.apps.answer`, :class:`~fedblend.flower.
  node.Node`), run by Flower's Ray backend in a pool of ``actors`` Ray actors that live for the whole run. There
  is one virtual SuperNode per client (``partition-id = c``, ``num-partitions`` = the run's clients, as Flower's
  simulation sets them), so a round's clients spread over the actors.
* **Client states live in the node's Context** (:class:`ContextStates`: ``Context.state``, which Flower's
  simulation keeps per virtual node and sends with each message to whichever actor serves it, on any machine of
  the Ray cluster), versioned as on a deployed node; the server records only the version. Each actor builds the
  run's partition once (:func:`fedblend.flower.node.federated`) and keeps the Nodes it served.

Ray: without ``address`` (or ``RAY_ADDRESS``), a private local Ray instance (``address="local"``) with
``actors`` CPUs and an object store capped at :data:`OBJECT_STORE_BYTES`; each actor takes one CPU. With an
address (a cluster started with ``ray start --head`` / ``ray start --address=HEAD:PORT``, docs/deploy.md), the
pool has one actor per CPU of the cluster (``ray start --num-cpus=K`` gives K), and the object store is the one
``ray start --object-store-memory`` set. Every machine needs fedblend (and the dataset files: ``data_dir`` if
given, else each machine's ``FEDBLEND_DATA``) installed; the driver passes its ``sys.path`` as the actors'
``PYTHONPATH`` (Flower's Ray backend does). Each node caches its clients' data in a temporary directory (removed
on this machine at the end; a cluster's other machines keep theirs in their temporary directory).

The contexts end with the simulation, so such a run cannot be resumed from its checkpoint (refused up front).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedblend.common.errors import ConfigError, RunInterrupted
from fedblend.config import RunConfig
from fedblend.flower import apps
from fedblend.flower.backend import FlowerRunError
from fedblend.flower.wire import from_record, to_record

OBJECT_STORE_BYTES = 150 * 1024**2  # Ray's object store of a local instance (Ray's default: 30% of the memory)
KEY = "fedblend-client-{cid}-v{version}"  # a client state's record in Context.state


class ContextStates:
    """Client states as records of a virtual node's ``Context.state`` (the interface of
    :class:`fedblend.flower.node.FileStates`): ``fedblend-client-C-vN`` holds version N of client C."""

    def __init__(self, state: RecordDict):
        self.state = state

    def load(self, cid: int, version: int) -> Any:
        key = KEY.format(cid=cid, version=version)
        if key not in self.state.array_records:
            raise KeyError(f"client {cid}'s state version {version} is not in its node's context")
        return from_record(self.state.array_records[key])

    def save(self, cid: int, version: int, state: Any, keep: int) -> None:
        """Store version ``version`` and drop the versions older than the last ``keep``."""
        self.state[KEY.format(cid=cid, version=version)] = to_record(state)
        prefix = KEY.format(cid=cid, version="")
        for key in [k for k in self.state.array_records if k.startswith(prefix)]:
            if int(key[len(prefix):]) <= version - max(1, keep):
                del self.state[key]


def client_app(rc: dict) -> ClientApp:
    """The ClientApp of a simulation with the run config ``rc`` (:mod:`fedblend.flower.apps`' keys): the
    deployment's node code, its clients' states in the node's Context."""
    app = ClientApp()

    def handle(msg: Message, context: Context) -> Message:
        return apps.answer(msg, context, run_config=rc, states=ContextStates(context.state))

    app.query()(handle)
    app.train()(handle)
    app.evaluate()(handle)
    return app


def backend_config(actors: int, address: str | None) -> dict:
    """Flower's Ray backend config: one CPU per actor; a private local instance with ``actors`` CPUs and a
    capped object store, on loopback only (joining a cluster is explicit: ``address``), or the cluster at
    ``address``."""
    init: dict[str, Any] = {"address": address} if address else {
        "address": "local", "num_cpus": int(actors), "object_store_memory": OBJECT_STORE_BYTES,
        "_node_ip_address": "127.0.0.1"}  # a local simulation binds to loopback, not the machine's address
    init.update(include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    return {"init_args": init, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}


def simulate(cfg: RunConfig, out: str | Path, data_dir: str | Path | None = None, *, resume: bool = False,
             force: bool = False, progress=None, actors: int | None = None, address: str | None = None) -> dict:
    """Run ``cfg`` on Flower's Simulation Engine (module docstring), writing ``out`` as ``fedblend run`` does;
    returns the run's summary. ``actors``: Ray actors of a local instance (default the config's ``workers``);
    ``address``: a Ray cluster's (default ``$RAY_ADDRESS``; none: a local instance); the nodes use this
    process's torch thread count (1, as ``fedblend run``, for equal results)."""
    import torch

    from fedblend.rundir import check_out_dir

    if importlib.util.find_spec("ray") is None:
        raise ConfigError("backend 'flower-sim' needs Ray: pip install 'fedblend[simulation]' "
                          "(flwr[simulation]==1.41.0)")
    if cfg.device == "cuda":
        raise ConfigError("backend 'flower-sim' runs clients on the CPU; use device = 'cpu'")
    out = Path(out)
    if resume and (out / "checkpoint.pt").exists():
        raise ConfigError(f"backend 'flower-sim' keeps client states in the simulation's node contexts, which "
                          f"ended with it: {out} cannot be resumed (run it again with --force)")
    check_out_dir(out, resume, force)  # before Ray starts
    address = address or os.environ.get("RAY_ADDRESS") or None
    tmp = tempfile.mkdtemp(prefix="fedblend-sim-")  # the nodes' data caches (on each machine that serves them)
    if data_dir is None and not address:  # a local instance: this process's $FEDBLEND_DATA, whatever the actors' cwd
        data_dir = os.environ.get("FEDBLEND_DATA") or None
    rc = {"fedblend-config": json.dumps(cfg.resolved(), sort_keys=True), "out": str(out.resolve()),
          "data-dir": str(Path(data_dir).expanduser().resolve()) if data_dir else "",
          # virtual nodes are never down, only slow (an actor that builds its partition on a busy machine took
          # over 300 s to answer the greeting at load 12): no exchange of a simulation ends by a deadline
          "num-nodes": cfg.partition.num_clients, "timeout": 7 * 86400.0, "wait-nodes": 7 * 86400.0,
          "min-clients": 1, "threads": torch.get_num_threads(), "resume": resume, "force": force, "poll": 0.01,
          "keep": 2, "state-dir": tmp}
    result: dict[str, Any] = {}
    stop = threading.Event()
    server = ServerApp()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        try:
            result["summary"] = apps.serve(grid, rc, progress=progress, echo=False, stop=stop)
        except BaseException as exc:  # noqa: BLE001 - raised again by _run, in the caller's thread
            result["error"] = exc
        finally:
            result["done"] = True

    return _run(server, client_app(rc), cfg.partition.num_clients, backend_config(actors or cfg.workers, address),
                result, tmp, stop)


def _run(server: ServerApp, client: ClientApp, nodes: int, bconf: dict, result: dict, tmp: str,
         stop: threading.Event) -> dict:
    """``run_simulation`` with Flower's INFO log and Ray's usage stats off; restores the environment it changes
    (Flower's Ray backend sets ``PYTHONPATH``) and removes the local data caches. Ctrl-C (or SIGTERM, which
    ``fedblend run`` turns into it) reaches this thread: Flower then stops its engine and Ray, and ``stop`` ends
    the ServerApp thread's wait for replies, so the run stops as ``fedblend run`` does (its lock released)."""
    from flwr.simulation import run_simulation

    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_USAGE_STATS_ENABLED")}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():  # Ray's FutureWarning about GPU env vars (no GPU is asked for)
            warnings.filterwarnings("ignore", message=".*accelerator visible devices", category=FutureWarning)
            run_simulation(server_app=server, client_app=client, num_supernodes=nodes, backend_config=bconf)
    except BaseException as exc:
        stop.set()
        end = time.monotonic() + 60
        while "done" not in result and time.monotonic() < end:  # the ServerApp thread ends its run
            time.sleep(0.05)
        err = result.get("error")
        if isinstance(exc, KeyboardInterrupt) and isinstance(err, RunInterrupted):  # what was kept, no resume
            text = str(err).split("; resume with")[0]
            raise RunInterrupted(f"{text} (backend 'flower-sim' cannot resume: the clients' states ended with the "
                                 f"simulation's contexts)", err.completed_rounds) from None
        raise
    finally:
        flwr_log.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
    if "error" in result:
        raise result["error"]
    if "summary" not in result:
        raise FlowerRunError("the Flower simulation ended without a result (see Flower's log above)")
    return result["summary"]
