"""A Flower node's side: the client halves of the clients whose data the node holds, their states on the node.

A SuperNode is started with a node config (``--node-config``)::

    partition-id = K          this node's share: clients c with c % num-partitions == K
    num-partitions = N        (default 1: every client)
    clients = "0,3,7"         or the client ids, explicitly (instead of partition-id / num-partitions)
    data-dir = "/data"        its own dataset directory (default: the run's data-dir, then $FEDBLEND_DATA)
    state-dir = "/var/fb"     where its clients' states live (default: the run config's ``state-dir``/node-K,
                              then ~/.fedblend/flower-node-K)
    threads = 1               torch threads (default: the run's ``threads``)

The node builds the federated partition of the run config (same dataset, partition spec and seed as the server,
so client ``c`` gets exactly the data it has in ``fedblend run``), keeps only its own clients and caches them
under its state directory. Client states never leave the node: each new state is written to the state directory
as version ``n`` of that client (the server only records the version number), so a node that dies and is
started again with the same state directory rejoins with its clients' states, and a server resumed from an
older checkpoint asks for the older version it recorded. The last ``keep`` versions per client are kept.

Why files and not only Flower's ``Context.state``: the context lives in the SuperNode's memory (lost when the
node dies) and travels whole to every ClientApp process; files survive a restart and cost only the clients of
the message. The simulation (:mod:`fedblend.flower.sim`) is the exception: there any Ray actor, on any machine
of the cluster, may serve a virtual node's message, so its clients' states travel in the node's ``Context``.
"""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import Any

import torch

from fedblend.common.codec import decode, encode
from fedblend.common.errors import HookError
from fedblend.common.rng import SeedTree
from fedblend.config import RunConfig, config_from_dict
from fedblend.core.client import EVALUATE, ClientJob, ClientRuntime
from fedblend.core.message import Message
from fedblend.core.method import RunInfo
from fedblend.data.federated import ClientData, build_federated
from fedblend.data.sources import load_dataset
from fedblend.flower.wire import VERSION_KEY, fingerprint, shape_errors
from fedblend.models.zoo import initial_model, model_params


class NodeDataError(ValueError):
    """The node's data or node config does not match the run config."""


def node_clients(node_config: dict, num_clients: int) -> list[int]:
    """The client ids a node serves, from its node config (see the module docstring)."""
    if "clients" in node_config:
        try:
            cids = sorted({int(c) for c in str(node_config["clients"]).replace(" ", "").split(",") if c})
        except ValueError as exc:
            raise NodeDataError(f"node config clients={node_config['clients']!r}: give client ids like "
                                f"'0,3,7'") from exc
    elif "partition-id" in node_config:
        k, n = int(node_config["partition-id"]), int(node_config.get("num-partitions", 1))
        if n < 1 or not 0 <= k < n:
            raise NodeDataError(f"node config partition-id={k} must be in 0..num-partitions-1 "
                                f"(num-partitions={n})")
        cids = list(range(k, num_clients, n))
    else:
        raise NodeDataError("the node config has neither partition-id nor clients: start the SuperNode with "
                            "--node-config 'partition-id=K num-partitions=N'")
    bad = [c for c in cids if not 0 <= c < num_clients]
    if bad:
        raise NodeDataError(f"node config names clients {bad}, but the run has {num_clients} clients (0.."
                            f"{num_clients - 1})")
    if not cids:
        raise NodeDataError(f"node config {dict(node_config)} selects no client of the run's {num_clients}")
    return cids


def run_config_of(run_config: dict) -> RunConfig:
    return config_from_dict(json.loads(str(run_config["fedblend-config"])))


class Node:
    """The client runtime of one node for one run (built once per ClientApp process)."""

    def __init__(self, run_config: dict, node_config: dict, run_key: str):
        self.cfg = cfg = run_config_of(run_config)
        torch.set_num_threads(int(node_config.get("threads", run_config.get("threads", 1))))
        label = node_config.get("partition-id", node_config.get("clients", "0"))
        base = node_config.get("state-dir") or (Path(str(run_config["state-dir"])) / f"node-{label}"
                                                 if run_config.get("state-dir") else None)
        self.dir = Path(str(base or Path.home() / ".fedblend" / f"flower-node-{label}")) / run_key
        self.dir.mkdir(parents=True, exist_ok=True)
        data_dir = node_config.get("data-dir") or run_config.get("data-dir") or None
        data, info = self._load_data(cfg, node_config, data_dir)
        self.cids = sorted(data)
        self.fingerprints = {c: fingerprint(d) for c, d in data.items()}
        tree = SeedTree(cfg.seed)
        model = initial_model(cfg.model, info, tree.torch("model-init"), cfg.init)
        model.requires_grad_(False)
        self.run = RunInfo(model=model, init_params=model_params(model), train=cfg.train,
                           num_clients=info["num_clients"], rounds=cfg.rounds, seed=cfg.seed, device="cpu")
        self.shapes = {k: tuple(v.shape) for k, v in self.run.init_params.items()}
        self.runtime = ClientRuntime(cfg.build_method(), self.run, data, tree)
        self.states: Any = FileStates(self.dir)  # or, per message, the node's Context (handle's ``states``)

    def _load_data(self, cfg: RunConfig, node_config: dict, data_dir) -> tuple[dict[int, ClientData], dict]:
        """This node's clients' data: from the cache in the state directory, else built from the dataset."""
        cache = self.dir / "data.pt"
        if cache.exists():  # memory-mapped: a ClientApp process reads only the pages its clients touch
            saved = decode(torch.load(cache, map_location="cpu", weights_only=True, mmap=True))
            return {int(c): ClientData(**d) for c, d in saved["clients"].items()}, saved["info"]
        fed = federated(cfg, data_dir)
        cids = node_clients(node_config, fed.num_clients)
        data = {c: compact(fed.clients[c]) for c in cids}
        info = {**fed.info, "num_clients": fed.num_clients}
        _save(cache, {"clients": {str(c): vars(d) for c, d in data.items()}, "info": info})
        return data, info

    # ------------------------------------------------------------------------------------------ messages
    def hello(self) -> dict:
        """What the server checks before giving the node work: its clients and their data digests."""
        return {"clients": self.cids, "fingerprints": {str(c): f for c, f in self.fingerprints.items()},
                "dataset": self.cfg.dataset, "pid": os.getpid()}

    def handle(self, jobs: list[dict], keep: int, states: Any = None) -> list[dict]:
        """Run each job (a client error is that client's result, never the whole batch's). ``states``: where
        the clients' states live for this message (default the state directory, :class:`FileStates`; the
        simulation passes the node's Context, :class:`fedblend.flower.sim.ContextStates`)."""
        out = []
        for j in jobs:
            try:
                out.append(self._one(j, keep, states or self.states))
            except Exception as exc:  # noqa: BLE001 - reported to the server, which drops that client
                out.append({"cid": j.get("cid"), "ok": False,
                            "error": f"{type(exc).__name__}: {exc}",
                            "trace": traceback.format_exc(limit=3)})
                if isinstance(exc, HookError):  # the plug-in's fault, not the node's: the server stops the run
                    out[-1]["hook_error"] = [str(exc), exc.plugin, exc.hook, exc.round, exc.client]
        return out

    def _one(self, j: dict, keep: int, states: Any) -> dict:
        cid, phase, version = int(j["cid"]), str(j["phase"]), j.get("version")
        if cid not in self.runtime.data:
            raise NodeDataError(f"client {cid} is not on this node (it holds {self.cids})")
        msg = Message(j["msg"]["arrays"], j["msg"]["metrics"], j["msg"]["config"])
        bad = shape_errors(msg.arrays, self.shapes)
        if bad:
            raise ValueError(f"refused the {phase} message for client {cid}: wrong tensor shapes ({'; '.join(bad)})")
        state = None if version is None else states.load(cid, int(version))
        res = self.runtime.handle(ClientJob(phase, cid, int(j["rnd"]), msg, state))
        new_version = None
        if phase != EVALUATE and res.state is not None:
            new_version = (int(version) if version is not None else 0) + 1
            states.save(cid, new_version, res.state, keep)
        reply = res.reply
        return {"cid": cid, "ok": True, "version": new_version, "stats": res.stats,
                "reply": {"arrays": reply.arrays, "metrics": reply.metrics, "config": reply.config}}



class FileStates:
    """Client states as files in a node's state directory, one per client and version (``client-C-vN.pt``)."""

    def __init__(self, directory: Path):
        self.dir = directory

    def _path(self, cid: int, version: int) -> Path:
        return self.dir / f"client-{cid}-v{version}.pt"

    def load(self, cid: int, version: int) -> Any:
        path = self._path(cid, version)
        if not path.exists():
            raise FileNotFoundError(f"client {cid}'s state version {version} is not in {self.dir} (was the node "
                                    f"restarted with another state-dir?)")
        return decode(torch.load(path, map_location="cpu", weights_only=True))

    def save(self, cid: int, version: int, state: Any, keep: int) -> None:
        """Write version ``version`` and drop the versions older than the last ``keep``."""
        _save(self._path(cid, version), state)
        for f in self.dir.glob(f"client-{cid}-v*.pt"):
            if int(f.stem.rsplit("-v", 1)[1]) <= version - max(1, keep):
                f.unlink(missing_ok=True)


_FEDERATED: dict[str, Any] = {}  # one entry: the last federated dataset this process built


def federated(cfg: RunConfig, data_dir) -> Any:
    """The run's federated dataset, built once per process: a process that serves several nodes (a Ray actor of
    the simulation, :mod:`fedblend.flower.sim`) builds the partition once, not once per node."""
    key = json.dumps([cfg.dataset, str(data_dir), str(cfg.partition), cfg.seed], default=str)
    if key not in _FEDERATED:
        _FEDERATED.clear()
        _FEDERATED[key] = build_federated(load_dataset(cfg.dataset, data_dir), cfg.partition, cfg.seed)
    return _FEDERATED[key]


def compact(d: ClientData) -> ClientData:
    """``d`` with each tensor in its own storage. A client's tensors are views into the whole dataset's
    storage, and ``torch.save`` writes a view's whole storage: saved as views, a node's cache held the full
    dataset (300.6 MB for 111.9 MB of its clients' tensors)."""
    return ClientData(**{k: v.clone(memory_format=torch.contiguous_format) for k, v in vars(d).items()})


def _save(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    torch.save(encode(obj), tmp)
    os.replace(tmp, path)


def version_of(state: Any) -> int | None:
    """The node-side version a server-side marker state names (None: first contact)."""
    return None if state is None else int(state[VERSION_KEY])
