"""Flower deployment (fedblend.flower): skipped with a reason when the extra (pip install 'fedblend[flower]') is
missing.

* In-process (fast): the Flower backend over a grid that hands each message to a node's ClientApp code in this
  process -- results equal the sequential backend's for every registered method; a node that goes down, a node
  whose data does not match, replies and messages with wrong tensor shapes.
* Real processes on loopback (tens of seconds each): a SuperLink + SuperNodes running the app for 2 rounds on
  tiny real FMNIST data and equal to ``fedblend run``; a SuperNode killed in round 2 of 4 and restarted; TLS
  with SuperNode authentication refusing an unregistered node.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the Flower extra is not installed (pip install 'fedblend[flower]')")

import torch  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedblend.algorithms import METHODS  # noqa: E402
from fedblend.config import load_config  # noqa: E402
from fedblend.core.checkpoint import load_checkpoint  # noqa: E402
from fedblend.experiment import run_experiment  # noqa: E402
from fedblend.flower import apps  # noqa: E402
from fedblend.flower.backend import FlowerBackend, FlowerRunError  # noqa: E402
from fedblend.flower.node import Node  # noqa: E402
from fedblend.flower.wire import from_record, shape_errors, to_record  # noqa: E402
from tests.helpers import NODE_TIMEOUT, history  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["dataset='synthetic'", "model='mlp'", "rounds=3", "seed=3", "checkpoint_every=1", "partition.num_clients=4",
        "partition.min_samples=5", "train.lr=0.05", "train.batch_size=16"]


def tiny_cfg(method: str = "fedavg", *extra: str):
    return load_config(None, [*TINY, f"method={method!r}", *extra])


class LocalGrid:
    """Flower's Grid, but each message is answered in this process by ``fedblend.flower.apps.answer`` with the
    node's own Context (node config, run config): the whole wire path (records, node store, checks) without
    processes. ``down`` nodes do not answer."""

    def __init__(self, run_config: dict, node_configs: dict[int, dict]):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
        self.run_config, self.nodes, self.down = run_config, dict(node_configs), set()
        self.sent: list = []

    def get_node_ids(self):
        return [n for n in self.nodes if n not in self.down]

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for m in messages:
            self.sent.append(m)
            nid = m.metadata.dst_node_id
            if nid in self.down or nid not in self.nodes:
                continue
            ctx = Context(1, nid, self.nodes[nid], RecordDict(), self.run_config)
            out.append(apps.answer(m, ctx))
        return out


class PushPullGrid(LocalGrid):
    """LocalGrid behind Flower's push / pull API (the ServerApp's path, ``poll`` set): each pushed message gets
    an id and its reply names it. ``fault(message) -> Message | None`` replaces a node's answer with an error
    reply built as Flower builds its own (the SuperLink's for an offline node, the SuperNode's for a ClientApp
    process that stopped responding)."""

    def __init__(self, run_config: dict, node_configs: dict[int, dict], fault=None):
        super().__init__(run_config, node_configs)
        self.fault, self.replies = fault, {}

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id  # as flwr's HTTP grid does
            self.sent.append(m)
            nid = m.metadata.dst_node_id
            reply = self.fault(m) if self.fault else None
            if reply is None and nid in self.nodes and nid not in self.down:
                reply = apps.answer(m, Context(1, nid, self.nodes[nid], RecordDict(), self.run_config))
            if reply is not None:
                self.replies[m.metadata.message_id] = reply
            ids.append(m.metadata.message_id)
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(i) for i in list(message_ids) if i in self.replies]


def superlink_error(m):
    """The SuperLink's reply to a message for a node that stopped sending heartbeats (its source: the
    SuperLink, not the node)."""
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    return create_message_error_unavailable_res_message(m.metadata, "node_unavail")


def clientapp_crashed(m):
    """A SuperNode's reply when the ClientApp process's task token expired (Flower error 8)."""
    from flwr.app import Message
    from flwr.supernode.nodestate.in_memory_nodestate import CLIENT_APP_CRASHED_ERROR

    return Message(CLIENT_APP_CRASHED_ERROR, reply_to=m)

def run_config(cfg, **kw) -> dict:
    return {"fedblend-config": json.dumps(cfg.resolved()), "threads": 1, **kw}


def flower_run(cfg, tmp: Path, nodes: int = 2, grid=None, **backend_kw):
    grid = grid or LocalGrid(run_config(cfg), {100 + k: {"partition-id": k, "num-partitions": nodes,
                                                         "state-dir": str(tmp / f"node-{k}")} for k in range(nodes)})
    backend = FlowerBackend(grid, apps.run_key(cfg.resolved(), tmp / "out"), nodes=len(grid.nodes), timeout=5,
                            keep=4, log=lambda _t: None, **backend_kw)
    run_experiment(cfg, tmp / "out", backend=backend)
    return [json.loads(line) for line in (tmp / "out" / "metrics.jsonl").read_text().splitlines()], grid


def sim_run(cfg, tmp: Path):
    run_experiment(cfg, tmp / "sim")
    return [json.loads(line) for line in (tmp / "sim" / "metrics.jsonl").read_text().splitlines()]


SCORES = ("acc", "loss", "train_loss", "global_acc", "bytes_down", "bytes_up", "selected")


@pytest.mark.parametrize("method", [*sorted(METHODS), "fedavg+ala"])
def test_flower_backend_equals_simulator(method, tmp_path):
    """Every registered method: the same per-round scores through Flower records and node-held states as in
    the sequential simulator, bit for bit (same seed, one thread)."""
    cfg = tiny_cfg(method)
    sim = sim_run(cfg, tmp_path)
    flw, grid = flower_run(cfg, tmp_path)
    assert len(flw) == cfg.rounds and all("dropped_clients" not in m and "flower_faults" not in m for m in flw)
    for a, b in zip(sim, flw):
        assert {k: a.get(k) for k in SCORES} == {k: b.get(k) for k in SCORES}, method
    # the states stayed on the nodes: nothing but version markers in the server's checkpoint
    ck = load_checkpoint(tmp_path / "out" / "checkpoint.pt")
    assert ck["clients"] and all(set(s) == {"flower_state_version"} for s in ck["clients"].values())
    assert list((tmp_path / "node-0").rglob("client-0-v*.pt"))


def test_node_down_then_rejoins(tmp_path):
    """A node that stops answering in round 2 drops its clients from that round (metrics say which and why),
    the run goes on; back in round 3 (a new node id, the same state directory), its clients train from their
    states again."""
    cfg = tiny_cfg("fedavg-ft", "rounds=4")
    nodes = {100 + k: {"partition-id": k, "num-partitions": 2, "state-dir": str(tmp_path / f"node-{k}")}
             for k in range(2)}
    grid = LocalGrid(run_config(cfg), nodes)

    class Flaky(LocalGrid):
        def send_and_receive(self, messages, *, timeout=None):
            rnd = max([int(m.metadata.group_id or 0) for m in messages] + [0])
            if rnd == 1:
                self.down.add(101)  # node 1 dies during round 2
            out = super().send_and_receive(messages, timeout=timeout)
            if rnd == 1 and messages[0].metadata.message_type == "evaluate":
                self.nodes[201] = self.nodes.pop(101)  # ... and comes back after it, with a new node id
            return out

    grid.__class__ = Flaky
    hist, _ = flower_run(cfg, tmp_path, grid=grid)
    assert [m["round"] for m in hist] == [1, 2, 3, 4]
    assert hist[1]["dropped_clients"] == [1, 3]  # node 1 serves clients 1 and 3 (c % 2 == 1)
    assert any(f.get("clients") == [1, 3] and "no answer" in f["reason"] for f in hist[1]["flower_faults"])
    assert hist[1]["eval_missing"] == 2
    assert "dropped_clients" not in hist[2] and "dropped_clients" not in hist[3]
    ck = load_checkpoint(tmp_path / "out" / "checkpoint.pt")
    # client 1 trained in rounds 1, 3, 4 (not 2): its state is at version 3 on its node, continued from round 1's
    assert ck["clients"][1]["flower_state_version"] == 3 and ck["clients"][0]["flower_state_version"] == 4



def _nodes(tmp: Path, n: int = 2) -> dict[int, dict]:
    return {100 + k: {"partition-id": k, "num-partitions": n, "state-dir": str(tmp / f"node-{k}")} for k in range(n)}


def _round_2_train_to_101(m) -> bool:
    return m.metadata.dst_node_id == 101 and m.metadata.group_id == "1" and m.metadata.message_type == "train"


def test_superlink_error_reply_is_matched_to_its_node_with_its_reason(tmp_path):
    """An error reply made by the SuperLink (source: the SuperLink, not the node) counts as the node's: the fault
    names the node, its clients and Flower's reason, and the message is not sent again (an offline node)."""
    cfg = tiny_cfg("fedavg", "rounds=2")
    grid = PushPullGrid(run_config(cfg), _nodes(tmp_path),
                        fault=lambda m: superlink_error(m) if _round_2_train_to_101(m) else None)
    hist, _ = flower_run(cfg, tmp_path, grid=grid, poll=0.001)
    assert "dropped_clients" not in hist[0] and hist[1]["dropped_clients"] == [1, 3]
    fault = next(f for f in hist[1]["flower_faults"] if f.get("clients") == [1, 3])
    assert fault["node"] == 101 and "Node Unavailable" in fault["reason"]
    assert sum(map(_round_2_train_to_101, grid.sent)) == 1
    assert all("resent" not in e for m in hist for e in m["flower_exchanges"])


@pytest.mark.parametrize("poll", [None, 0.001])
def test_clientapp_that_stopped_responding_is_sent_again_and_changes_nothing(tmp_path, poll):
    """A ClientApp process that stopped responding (Flower error 8) in round 2's training: the message is sent
    again, the round has every client, and the run's scores equal a faultless run's bit for bit; with
    ``retries=0`` the node's clients are dropped from that round with Flower's reason."""
    cfg = tiny_cfg("fedavg-ft", "rounds=3")
    clean, _ = flower_run(cfg, tmp_path / "clean", grid=PushPullGrid(run_config(cfg), _nodes(tmp_path / "clean")),
                          poll=0.001)
    hit: list[str] = []

    def once(m):  # the first train message of round 2 to node 101
        if _round_2_train_to_101(m) and not hit:
            hit.append(m.metadata.message_id)
            return clientapp_crashed(m)
        return None

    grid = PushPullGrid(run_config(cfg), _nodes(tmp_path / "a"), fault=once)
    if poll is None:  # Flower's own send_and_receive over the same push / pull
        grid.send_and_receive = lambda msgs, timeout=None: [r for m in msgs for r in grid.pull_messages(
            grid.push_messages([m]))]
    hist, grid = flower_run(cfg, tmp_path / "a", grid=grid, poll=poll)
    assert hit and all("dropped_clients" not in m and "flower_faults" not in m for m in hist)
    for a, b in zip(clean, hist):
        assert {k: a.get(k) for k in SCORES} == {k: b.get(k) for k in SCORES}
    assert hist[1]["flower_exchanges"][0]["resent"] == {"101": "ClientApp stopped responding."}
    assert sum(map(_round_2_train_to_101, grid.sent)) == 2

    hit.clear()
    grid = PushPullGrid(run_config(cfg), _nodes(tmp_path / "b"), fault=once)
    hist, _ = flower_run(cfg, tmp_path / "b", grid=grid, poll=0.001, retries=0)
    assert hist[1]["dropped_clients"] == [1, 3]
    assert any(f.get("node") == 101 and "ClientApp stopped responding" in f["reason"]
               for f in hist[1]["flower_faults"])


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1"])
def test_retries_must_be_a_whole_number_at_least_zero(bad):
    with pytest.raises(FlowerRunError, match="retries must be a whole number"):
        FlowerBackend(None, "key", retries=bad)

def test_server_killed_resumes_from_checkpoint(tmp_path):
    """A server stopped after round 2 of 4 (checkpoint every 2 rounds, so the nodes already hold newer states
    than the checkpoint names) resumes from its checkpoint with the nodes' older state versions: the same
    history as an uninterrupted run."""
    cfg = tiny_cfg("fedavg-ft", "rounds=4", "checkpoint_every=2")
    full, _ = flower_run(cfg, tmp_path / "a")
    grid = LocalGrid(run_config(cfg), {100 + k: {"partition-id": k, "num-partitions": 2,
                                                 "state-dir": str(tmp_path / "b" / f"node-{k}")} for k in range(2)})
    out = tmp_path / "b" / "out"

    def backend():
        return FlowerBackend(grid, apps.run_key(cfg.resolved(), out), nodes=2, timeout=5, keep=6, log=lambda _t: None)

    run_experiment(cfg, out, backend=backend(), stop_after=3)  # round 3 ran, its checkpoint was not written
    run_experiment(cfg, out, backend=backend(), resume=True)
    again = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["round"] for m in again] == [1, 2, 3, 4]
    for a, b in zip(full, again):
        assert {k: a.get(k) for k in SCORES} == {k: b.get(k) for k in SCORES}


def test_node_with_other_data_is_refused(tmp_path):
    """A node whose data differs from the run's partition (here: another partition seed) is refused with a
    reason naming its clients; the run goes on without them."""
    cfg = tiny_cfg("fedavg", "rounds=2")
    other = tiny_cfg("fedavg", "rounds=2", "partition.alpha=5.0")
    nodes = {100: {"partition-id": 0, "num-partitions": 2, "state-dir": str(tmp_path / "a")},
             101: {"partition-id": 1, "num-partitions": 2, "state-dir": str(tmp_path / "b")}}
    grid = LocalGrid(run_config(cfg), nodes)
    real = apps.answer

    def answer(msg, ctx):  # node 101 was started for another partition
        if ctx.node_id == 101:
            ctx = Context(1, 101, ctx.node_config, RecordDict(), run_config(other))
        return real(msg, ctx)

    apps_answer, apps.answer = apps.answer, answer
    try:
        hist, _ = flower_run(cfg, tmp_path, grid=grid)
    finally:
        apps.answer = apps_answer
    faults = hist[0]["flower_faults"]
    assert any(f.get("node") == 101 and "does not match the run's partition" in f["reason"] for f in faults)
    assert hist[0]["dropped_clients"] == [1, 3] and hist[1]["dropped_clients"] == [1, 3]
    assert hist[0]["acc"] == hist[0]["acc"]  # evaluated over the clients that answered


def test_wrong_shapes_are_refused(tmp_path):
    """A reply with a tensor of the wrong shape is not aggregated (the client is dropped, the reason recorded);
    a message with wrong shapes is refused by the node."""
    cfg = tiny_cfg("fedavg", "rounds=2")
    original = Node.handle

    def corrupt(self, jobs, keep, states=None):
        out = original(self, jobs, keep, states)
        for r in out:
            if r["cid"] == 2 and r.get("ok") and "params" in r["reply"]["arrays"]:
                name = next(iter(r["reply"]["arrays"]["params"]))
                r["reply"]["arrays"]["params"][name] = torch.zeros(3, 3)
        return out

    Node.handle = corrupt
    try:
        hist, _ = flower_run(cfg, tmp_path)
    finally:
        Node.handle = original
    assert hist[0]["dropped_clients"] == [2]
    assert any("wrong tensor shapes" in f["reason"] and f["clients"] == [2] for f in hist[0]["flower_faults"])
    # the node side
    node = Node(run_config(cfg), {"partition-id": 0, "state-dir": str(tmp_path / "n")}, "k")
    name, shape = next(iter(node.shapes.items()))
    res = node.handle([{"phase": "train", "cid": 0, "rnd": 0, "version": None,
                        "msg": {"arrays": {"params": {name: torch.zeros(*shape, 2)}}, "metrics": {}, "config": {}}}], 2)
    assert not res[0]["ok"] and "wrong tensor shapes" in res[0]["error"] and name in res[0]["error"]
    assert shape_errors({"p": {name: torch.zeros(shape)}}, node.shapes) == []


def test_node_cache_holds_only_its_clients_tensors_and_reloads_them_equal(tmp_path):
    """The node's data cache stores its own clients' tensors compactly (not the dataset storage they view),
    and a node started again on it (memory-mapped) holds exactly the data ``fedblend run`` gives those clients."""
    from fedblend.data.federated import build_federated
    from fedblend.data.sources import load_dataset

    cfg = tiny_cfg()
    node_cfg = {"partition-id": 1, "num-partitions": 2, "state-dir": str(tmp_path / "n")}
    first = Node(run_config(cfg), node_cfg, "k")
    tensors = [v for c in first.cids for v in vars(first.runtime.data[c]).values()]
    payload = sum(v.numel() * v.element_size() for v in tensors)
    size = (tmp_path / "n" / "k" / "data.pt").stat().st_size
    assert payload <= size <= payload + 64 * 1024 + 1024 * len(tensors)
    again = Node(run_config(cfg), node_cfg, "k")
    fed = build_federated(load_dataset(cfg.dataset, None), cfg.partition, cfg.seed)
    assert again.cids == first.cids == list(range(1, fed.num_clients, 2))
    for c in again.cids:
        for k, v in vars(again.runtime.data[c]).items():
            want = getattr(fed.clients[c], k)
            assert v.dtype == want.dtype and torch.equal(v, want), (c, k)
    assert again.fingerprints == first.fingerprints


def test_node_config_errors():
    from fedblend.flower.node import NodeDataError, node_clients

    assert node_clients({"partition-id": 1, "num-partitions": 3}, 7) == [1, 4]
    assert node_clients({"clients": "5, 0"}, 7) == [0, 5]
    for bad, match in (({"partition-id": 3, "num-partitions": 3}, "partition-id=3"), ({}, "neither"),
                       ({"clients": "2,9"}, "names clients \\[9\\]"), ({"clients": "a"}, "client ids")):
        with pytest.raises(NodeDataError, match=match):
            node_clients(bad, 7)


def test_deploy_write_app(tmp_path, capsys):
    """``fedblend deploy --write-app``: a Flower app whose run config carries the resolved config unchanged."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from fedblend.cli.main import main

    args = [f"--set={a}" for a in TINY]
    assert main(["deploy", *args, "--nodes", "3", "--retries", "4", "--out", str(tmp_path / "out"), "--write-app",
                 str(tmp_path / "app")]) == 0
    app = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    assert app["components"]["serverapp"] == "fedblend.flower.apps:server_app"
    assert json.loads(app["config"]["fedblend-config"]) == json.loads(json.dumps(tiny_cfg().resolved()))
    assert app["config"]["num-nodes"] == 3 and app["config"]["out"] == str((tmp_path / "out").resolve())
    assert app["config"]["retries"] == 4  # what the ServerApp's backend reads
    assert "flwr run" in capsys.readouterr().out



def test_deploy_passes_retries_to_the_deployment(tmp_path, monkeypatch):
    """``fedblend deploy --retries R`` reaches the deployment (and from there the app's run config, as
    ``--write-app`` shows above); the default is 1."""
    from fedblend.cli.main import main
    from fedblend.flower import deploy

    seen = []
    monkeypatch.setattr(deploy, "deploy_local", lambda *a, **kw: seen.append(kw["retries"]) or {"rounds": 1})
    args = [f"--set={a}" for a in TINY]
    for extra in (["--retries", "0"], []):
        assert main(["deploy", *args, *extra, "--quiet", "--out", str(tmp_path / f"o{len(seen)}")]) == 0
    assert seen == [0, 1]

def test_records_round_trip():
    obj = {"a": torch.arange(6, dtype=torch.int64).view(2, 3), "b": [1.5, float("inf"), None, "x"],
           "c": {"h": torch.ones(2, dtype=torch.bfloat16)}}
    back = from_record(to_record(obj))
    assert torch.equal(back["a"], obj["a"]) and back["b"][:2] == [1.5, float("inf")] and back["b"][2:] == [None, "x"]
    assert back["c"]["h"].dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------------ real processes
FMNIST_TINY = ["dataset='fmnist'", "model='mlp'", "rounds=2", "seed=1", "checkpoint_every=1",
               "partition.kind='one_class'", "partition.num_clients=3", "partition.samples_per_client=40",
               "partition.split='official'", "partition.test_per_client=40", "train.batch_size=20", "train.lr=0.05"]


def test_deploy_on_loopback_equals_fedblend_run(tmp_path, real_data_dir, flwr_bin, monkeypatch):
    """``fedblend deploy``: a real SuperLink and 2 SuperNodes (processes) on loopback run 2 rounds of FedAvg on
    tiny real FMNIST data; the per-round scores equal ``fedblend run``'s; no process is left behind. Every proxy
    variable points at a dead port meanwhile (a machine behind a proxy): the processes reach each other anyway
    (tests/test_deploy_proxy.py checks how)."""
    from fedblend.flower.deploy import deploy_local
    from tests.test_deploy_proxy import DEAD_PROXY, PROXY_VARS

    cfg = load_config(None, FMNIST_TINY)
    run_experiment(cfg, tmp_path / "sim", real_data_dir)
    for v in PROXY_VARS:
        monkeypatch.setenv(v, DEAD_PROXY)
    for v in ("no_proxy", "NO_PROXY", "no_grpc_proxy"):
        monkeypatch.delenv(v, raising=False)
    summary = deploy_local(cfg, tmp_path / "flw", nodes=2, data_dir=real_data_dir, timeout=120, run_timeout=400)
    assert summary["status"] == "finished" and summary["rounds"] == 2
    sim, flw = history(tmp_path / "sim"), history(tmp_path / "flw")
    for a, b in zip(sim, flw, strict=True):
        assert {k: a.get(k) for k in SCORES} == {k: b.get(k) for k in SCORES}
    assert (tmp_path / "flw" / "config.toml").exists() and (tmp_path / "flw" / "partition.json").exists()
    assert _children() == []


def _children() -> list[str]:
    """Flower processes still running that this test process started (none may be left)."""
    mine = str(os.getpid())
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if ("flower-super" in cmd or "flwr-" in cmd) and stat[3] == mine:
                out.append(cmd)
    return out


def test_supernode_killed_in_round_2_rejoins(tmp_path, real_data_dir, flwr_bin):
    """A SuperNode killed during round 2 of 4: the run finishes, round 2's metrics name the missing clients, the
    node restarted with its state directory rejoins and its clients train again in the later rounds."""
    from fedblend.flower.deploy import CONNECTION, local_federation, write_app

    cfg = load_config(None, [*FMNIST_TINY, "rounds=4", "eval.every=4"])  # one exchange a round, then evaluation
    out, work = tmp_path / "out", tmp_path / "fed"
    app = write_app(cfg, work / "app", out, real_data_dir, nodes=2, timeout=NODE_TIMEOUT)
    cfgs = [f'partition-id={k} num-partitions=2 state-dir="{work / f"node-{k}"}"' for k in range(2)]
    with local_federation(work) as fed:
        fed.start_superlink()
        for k in range(2):
            fed.start_supernode(k, cfgs[k])
        import subprocess

        run = subprocess.Popen([sys.executable, "-c", "import sys; from flwr.cli.app import app; sys.exit(app())",
                                "run", str(app), CONNECTION, "--stream"], env=fed.env, cwd=work,
                               stdout=open(work / "flwr-run.log", "wb"), stderr=subprocess.STDOUT)
        try:
            t0 = time.monotonic()
            while not (out / "metrics.jsonl").exists() or len(history(out)) < 1:
                assert time.monotonic() - t0 < 400 and run.poll() is None, "round 1 did not finish"
                time.sleep(0.5)
            fed.kill("supernode-1")  # round 2 has started
            while len(history(out)) < 2:
                assert time.monotonic() - t0 < 500 and run.poll() is None, "round 2 did not finish"
                time.sleep(0.5)
            fed.start_supernode(1, cfgs[1])  # back, with its state directory
            assert run.wait(500) == 0
        finally:
            if run.poll() is None:
                run.kill()
    hist = history(out)
    why = "\n".join(json.dumps({k: m.get(k) for k in ("round", "dropped_clients", "flower_faults", "flower_exchanges")})
                    for m in hist) + "\n" + _logs(work, 40)
    assert [m["round"] for m in hist] == [1, 2, 3, 4], why
    assert hist[1]["dropped_clients"] == [1], why  # node 1 serves client 1 (c % 2 == 1)
    assert any(1 in f.get("clients", []) for f in hist[1]["flower_faults"]), why
    assert "dropped_clients" not in hist[0], why
    assert any("dropped_clients" not in m for m in hist[2:]), why  # back (as soon as it reconnected)
    ck = load_checkpoint(out / "checkpoint.pt")
    assert ck["clients"][1]["flower_state_version"] >= 2  # trained again after the restart, from its old state
    assert json.loads((out / "summary.json").read_text())["rounds"] == 4
    assert _children() == []


def _logs(work: Path, lines: int = 15) -> str:
    """The last lines of every process log of a local federation (for a failing assertion's message)."""
    return "\n".join(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-lines:])
                     for f in sorted(work.glob("*.log")))


def test_tls_and_supernode_auth_refuse_unregistered_node(tmp_path, real_data_dir, flwr_bin):
    """TLS everywhere and SuperNode authentication: the registered node runs the app; a node whose key was not
    registered is refused by the SuperLink (it exits), and the run goes on without it."""
    from fedblend.flower.certs import make_certificates
    from fedblend.flower.deploy import CONNECTION, local_federation, write_app

    certs = make_certificates(tmp_path / "certs", nodes=2)
    cfg = load_config(None, [*FMNIST_TINY, "rounds=1", "partition.num_clients=2"])
    tls = {"ca": str(certs / "ca.crt"), "cert": str(certs / "server.crt"), "key": str(certs / "server.key")}
    work = tmp_path / "fed"
    with local_federation(work, tls=tls, auth=True) as fed:
        fed.start_superlink()
        assert fed.flwr("supernode", "register", str(certs / "node-0.pub"), CONNECTION, timeout=120).returncode == 0
        fed.start_supernode(0, f'partition-id=0 num-partitions=1 state-dir="{work / "n0"}"', key=str(certs / "node-0"))
        intruder = fed.start_supernode(1, f'partition-id=0 num-partitions=1 state-dir="{work / "n1"}"',
                                       key=str(certs / "node-1"))
        assert intruder.wait(120) != 0
        assert "Failed to activate SuperNode" in (work / "supernode-1.log").read_text()
        # the node's answer timeout is not under test here: the default, so that a loaded machine (a ClientApp
        # process importing torch took minutes on 2 busy cores) does not drop the only node
        app = write_app(cfg, work / "app", tmp_path / "out", real_data_dir, nodes=1)
        assert fed.flwr("run", str(app), CONNECTION, "--stream", timeout=900).returncode == 0
    assert (tmp_path / "out" / "summary.json").exists(), _logs(work)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["rounds"] == 1
    assert _children() == []
