"""The Flower backend: the engine's client jobs carried to SuperNodes through Flower's ``Grid``.

The engine (:class:`~fedblend.core.engine.Simulation`) runs its one round loop unchanged; this backend is only
*how* the jobs reach the clients, like the process backend, but over the network:

1. ``start``: wait for the expected number of SuperNodes, then greet every node (a ``query`` message): each
   answers with the client ids it serves and a digest of each client's data. A node whose digests differ from
   the server's partition (another dataset, another partition, other files) is refused (reported, never used);
   the run goes on with the others. A node that names clients another node serves takes them over (a node
   restarted with the same partition-id gets a new node id, while the dead one may still look alive).
2. ``run``: the jobs of a round are grouped per node (client ``c`` goes to the node that serves it) and sent as
   one Flower message per node (``train`` or ``evaluate``), pushed with ``grid.push_messages`` and collected
   with ``grid.pull_messages`` every ``poll`` seconds (Flower's ``send_and_receive`` polls every 3 s, which a
   small exchange pays in full; ``poll=None`` uses it); the replies that arrive within ``timeout`` seconds are
   decoded. Each node's reply says how long its ClientApp process had lived when fedblend's code started
   (interpreter start, imports of flwr, torch and fedblend, Flower's setup), how long the node took to load its
   clients and how long the clients' work took; ``flower_exchanges`` in metrics.jsonl keeps these per exchange
   beside its wall time (timings only, never results). A reply is matched to the message it answers, so an error
   reply made by the SuperLink or the Grid (whose source is not the node: the node stopped sending heartbeats,
   the reply's objects were lost) is the node's, with its reason. A message whose reply is one of Flower's
   transient errors (:data:`TRANSIENT`: the ClientApp process stopped responding, a message or its reply was
   lost) is sent again, up to ``retries`` times while the exchange's ``timeout`` lasts (``resent`` in
   ``flower_exchanges``); a node's job is a pure function of the job and the state version it names, so a
   resent job gives the same result. A client whose node is gone, did not answer in time, reported an error,
   or sent tensors of the wrong shapes gets no result (``None``): the engine leaves it out of the round
   (``dropped_clients`` in metrics.jsonl) and :meth:`report` says why (``flower_faults``). Fewer answers
   than ``min_clients`` in an exchange of several clients stops the run with an error (resume it from its
   checkpoint); one-client exchanges (methods with ``sequential_server``) are not checked.
3. New nodes are greeted at every exchange, so a node that was restarted (with its state directory) rejoins.

Client states stay on the nodes: the engine's client store holds only each client's state *version*
(``{"flower_state_version": n}``), which is what the checkpoint keeps.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import Message as FlowerMessage

from fedblend.common.errors import FedblendError, HookError
from fedblend.common.rng import SeedTree
from fedblend.core.backend import Backend
from fedblend.core.client import EVALUATE, ClientJob, ClientResult
from fedblend.core.message import Message
from fedblend.core.method import Method, RunInfo
from fedblend.data.federated import ClientData
from fedblend.flower.node import version_of
from fedblend.flower.wire import VERSION_KEY, content, fingerprint, shape_errors, unpack


class FlowerRunError(FedblendError):
    """The deployment cannot continue (too few nodes or answers)."""


#: Flower's error codes (``flwr.common.constant.ErrorCode``) of a failure of the transport, not of the node's
#: work: a message or its reply unavailable (3, 4; e.g. objects not uploaded before the push session expired)
#: and a ClientApp process that stopped responding (8: its task token expired, e.g. a process slow to start on a
#: busy machine). A reply with one of these is worth sending the message again; the node's own errors (code 0,
#: fedblend's refusals), a raised exception (1, 2) or an offline node (5) are not.
TRANSIENT = frozenset({3, 4, 8})


class FlowerBackend(Backend):
    name = "flower"

    def __init__(self, grid: Any, run_key: str, nodes: int = 1, timeout: float = 600.0, min_clients: int = 1,
                 keep: int = 2, wait_nodes: float = 300.0, log=None, poll: float | None = None, stop=None,
                 retries: int = 1):
        self.grid, self.run_key, self.nodes, self.poll, self.retries = grid, run_key, nodes, poll, retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise FlowerRunError(f"retries must be a whole number >= 0 (0: never send a message again), got "
                                 f"{retries!r}")
        self.stop = stop  # a threading.Event: set, the waits end with KeyboardInterrupt (the simulation's Ctrl-C)
        self.exchanges: list[dict] = []  # timings of the exchanges since the last report
        self.timeout, self.min_clients, self.keep, self.wait_nodes = timeout, min_clients, keep, wait_nodes
        self.owner: dict[int, int] = {}  # client id -> node id
        self.known: set[int] = set()  # node ids greeted (accepted or refused)
        self.faults: list[dict] = []  # since the last report
        self.log = log or logging.getLogger("fedblend.flower").info  # node changes and faults
        self.replies: dict[int, FlowerMessage] = {}  # the last exchange's replies, by node

    # ------------------------------------------------------------------------------------------ nodes
    def start(self, method: Method, run: RunInfo, data: Mapping[int, ClientData], tree: SeedTree) -> None:
        self.fingerprints = {cid: fingerprint(d) for cid, d in data.items()}
        self.shapes = {k: tuple(v.shape) for k, v in run.init_params.items()}
        t0 = time.monotonic()
        while len(list(self.grid.get_node_ids())) < self.nodes:
            if time.monotonic() - t0 > self.wait_nodes:
                have = len(list(self.grid.get_node_ids()))
                raise FlowerRunError(f"waited {self.wait_nodes:.0f}s for {self.nodes} SuperNodes, {have} connected; "
                                     f"start the missing ones (flower-supernode ... --node-config "
                                     f"'partition-id=K num-partitions=N')")
            self._check_stop()
            time.sleep(0.5)
        self._greet()
        missing = sorted(set(self.fingerprints) - set(self.owner))
        if missing:
            self.log(f"no node serves clients {missing}: they are left out until one joins")

    def _greet(self) -> None:
        """Greet the nodes that joined since the last call; forget the ones that left."""
        live = set(self.grid.get_node_ids())
        for nid in self.known - live:
            self.known.discard(nid)
        self.owner = {c: n for c, n in self.owner.items() if n in live}
        new = sorted(live - self.known)
        if not new:
            return
        msgs = [FlowerMessage(content=content("hello", {}, run_key=self.run_key), dst_node_id=nid,
                              message_type="query") for nid in new]
        replies = self._exchange(msgs, self.wait_nodes)
        for nid in new:
            self.known.add(nid)
            reply = replies.get(nid)
            if reply is None:
                self._fault("node did not answer the greeting", node=nid)
                continue
            if reply.has_error():
                self._fault(f"node refused: {reply.error.reason}", node=nid)
                continue
            hello, _ = unpack(reply.content, "hello")
            cids = [int(c) for c in hello["clients"]]
            wrong = [c for c in cids if hello["fingerprints"].get(str(c)) != self.fingerprints.get(c)]
            if wrong:
                self._fault(f"node refused: its data for clients {wrong} does not match the run's partition "
                            f"(dataset {hello.get('dataset')!r}; check its data-dir and partition-id)", node=nid)
                continue
            previous = sorted({self.owner[c] for c in cids if c in self.owner})
            for c in cids:
                self.owner[c] = nid
            self.log(f"node {nid} serves clients {cids}"
                     + (f" (taking them over from node(s) {previous}: a restarted node)" if previous else ""))

    def _fault(self, reason: str, node: int | None = None, clients: Sequence[int] = ()) -> None:
        entry = {"reason": reason}
        if node is not None:
            entry["node"] = int(node)
        if clients:
            entry["clients"] = sorted(int(c) for c in clients)
        self.faults.append(entry)
        self.log(" ".join(f"{k}={v}" for k, v in entry.items() if k != "reason") + f": {reason}")

    # ------------------------------------------------------------------------------------------ jobs
    def run(self, jobs: Sequence[ClientJob]) -> list[ClientResult | None]:
        self._greet()
        per = self.per_node(jobs)
        return self.collect(jobs, per, self.messages(jobs, per))

    def per_node(self, jobs: Sequence[ClientJob]) -> dict[int, list[int]]:
        """The jobs' indices grouped by the node that serves their client (a fault for clients no node serves)."""
        per: dict[int, list[int]] = {}
        orphans = []
        for i, job in enumerate(jobs):
            nid = self.owner.get(job.cid)
            if nid is None:
                orphans.append(job.cid)
            else:
                per.setdefault(nid, []).append(i)
        if orphans:
            self._fault("no live node serves them", clients=orphans)
        return per

    def messages(self, jobs: Sequence[ClientJob], per: Mapping[int, list[int]],
                 config: Mapping[str, Any] | None = None) -> list[FlowerMessage]:
        """One Flower message per node of ``per``, carrying its clients' jobs (``train``, or ``evaluate`` when
        every job evaluates; the round as its group id); ``config`` entries are added to each job message's
        config (the client half reads them in ``msg.config``)."""
        msgs = []
        for nid, idx in per.items():
            batch = [{"phase": jobs[i].phase, "cid": jobs[i].cid, "rnd": jobs[i].rnd,
                      "version": version_of(jobs[i].state),
                      "msg": {"arrays": jobs[i].msg.arrays, "metrics": jobs[i].msg.metrics,
                              "config": {**dict(config or {}), **jobs[i].msg.config}}} for i in idx]
            kind = "evaluate" if all(jobs[i].phase == EVALUATE for i in idx) else "train"
            msgs.append(FlowerMessage(content=content("jobs", batch, run_key=self.run_key, keep=self.keep),
                                      dst_node_id=nid, message_type=kind, group_id=str(jobs[idx[0]].rnd)))
        return msgs

    def collect(self, jobs: Sequence[ClientJob], per: Mapping[int, list[int]],
                msgs: list[FlowerMessage]) -> list[ClientResult | None]:
        """Send ``msgs`` (:meth:`messages`) and decode the replies into the jobs' results (None: no result, with
        the fault recorded); the replies, by node, stay in :attr:`replies` until the next exchange."""
        out: list[ClientResult | None] = [None] * len(jobs)
        t0 = time.monotonic()
        resent: dict[str, str] = {}
        replies = self._exchange(msgs, self.timeout, resent)
        self.replies = replies
        timing: dict[str, Any] = {"phase": "evaluate" if all(j.phase == EVALUATE for j in jobs) else "train",
                                  "seconds": round(time.monotonic() - t0, 4), "nodes": {}}
        if resent:
            timing["resent"] = resent
        self.exchanges.append(timing)
        for nid, idx in per.items():
            cids = [jobs[i].cid for i in idx]
            reply = replies.get(nid)
            if reply is None:
                self._fault(f"no answer (node down, or slower than the {self.timeout:g}s timeout)", node=nid,
                            clients=cids)
                continue
            if reply.has_error():
                self._fault(f"node error: {reply.error.reason}", node=nid, clients=cids)
                continue
            results, meta = unpack(reply.content, "results")
            timing["nodes"][str(nid)] = {k: meta[k] for k in ("process_age", "node_load", "work") if k in meta}
            by_cid = {int(r["cid"]): r for r in results if r.get("cid") is not None}
            for i in idx:
                out[i] = self._result(jobs[i], by_cid.get(jobs[i].cid), nid)
                self.finished(jobs[i])
        answered = sum(r is not None for r in out)
        if len(jobs) > 1 and answered < min(self.min_clients, len(jobs)):  # (one-client exchanges: not checked)
            raise FlowerRunError(f"round {jobs[0].rnd + 1}: {answered} of {len(jobs)} clients answered, fewer than "
                                 f"min_clients={self.min_clients}; the run stopped (resume it from its checkpoint "
                                 f"once the nodes are back)")
        return out

    def _exchange(self, msgs: list[FlowerMessage], timeout: float,
                  resent: dict[str, str] | None = None) -> dict[int, FlowerMessage]:
        """Send ``msgs`` and collect the replies that arrive within ``timeout`` seconds, by the node each message
        went to. A message answered by a :data:`TRANSIENT` error is sent again (a new message, same content), up
        to ``retries`` times before the deadline; ``resent`` collects why, per node."""
        end = time.monotonic() + timeout
        got: dict[int, FlowerMessage] = {}
        todo = list(msgs)
        for attempt in range(self.retries + 1):
            if attempt:
                todo = [_again(m) for m in todo]
            got.update(self._send(todo, end))
            todo = [m for m in todo if _transient(got.get(m.metadata.dst_node_id))]
            if not todo or attempt == self.retries or time.monotonic() >= end:
                break
            for m in todo:
                nid = m.metadata.dst_node_id
                reason = got[nid].error.reason
                self.log(f"node={nid}: {reason} (Flower error {got[nid].error.code}): message sent again")
                if resent is not None:
                    resent[str(nid)] = reason
        return got

    def _send(self, msgs: list[FlowerMessage], end: float) -> dict[int, FlowerMessage]:
        """One push of ``msgs`` and the replies pulled until all arrived or ``end`` (monotonic time), by the
        destination of the message each answers (a reply whose source is not a node, an error made by the
        SuperLink or the Grid, still names the message it answers)."""
        if self.poll is None:
            replies = list(self.grid.send_and_receive(msgs, timeout=max(0.0, end - time.monotonic())))
            dst = {m.metadata.message_id: m.metadata.dst_node_id for m in msgs if m.metadata.message_id}
        else:
            ids = list(self.grid.push_messages(msgs))
            dst = {mid: m.metadata.dst_node_id for mid, m in zip(ids, msgs) if mid}  # None: not pushed
            pending, replies = set(dst), []
            while pending:
                for m in self.grid.pull_messages(pending):
                    replies.append(m)
                    pending.discard(m.metadata.reply_to_message_id)
                if not pending or time.monotonic() >= end:
                    break
                self._check_stop()
                time.sleep(self.poll)
        return {dst.get(r.metadata.reply_to_message_id, r.metadata.src_node_id): r for r in replies}

    def _check_stop(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt("the Flower simulation was stopped")

    def _result(self, job: ClientJob, r: dict | None, nid: int) -> ClientResult | None:
        if r is None:
            self._fault("the node's reply has no result for this client", node=nid, clients=[job.cid])
            return None
        if not r.get("ok") and r.get("hook_error"):  # a client hook raised on the node: named, the run stops
            message, plugin, hook, rnd, cid = r["hook_error"]
            raise HookError(f"{message} (on node {nid})", plugin, hook, rnd, cid)
        if not r.get("ok"):
            self._fault(f"client failed on its node: {r.get('error')}", node=nid, clients=[job.cid])
            return None
        reply = Message(r["reply"]["arrays"], r["reply"]["metrics"], r["reply"]["config"])
        bad = shape_errors(reply.arrays, self.shapes)
        if bad:
            self._fault(f"reply refused: wrong tensor shapes ({'; '.join(bad)})", node=nid, clients=[job.cid])
            return None
        state = None if r.get("version") is None else {VERSION_KEY: int(r["version"])}
        if job.phase != EVALUATE and state is None:
            state = job.state
        return ClientResult(reply, state, dict(r.get("stats") or {}))

    def report(self) -> dict:
        """The faults noticed and the exchanges' timings since the last call (the engine adds them to the round's
        metrics)."""
        faults, self.faults = self.faults, []
        exchanges, self.exchanges = self.exchanges, []
        out: dict[str, Any] = {"flower_faults": faults} if faults else {}
        if exchanges:
            out["flower_exchanges"] = exchanges
        return out


def _transient(reply: FlowerMessage | None) -> bool:
    return reply is not None and reply.has_error() and reply.error.code in TRANSIENT


def _again(m: FlowerMessage) -> FlowerMessage:
    """A new message with ``m``'s content and destination (a message id is its content's and creation time's
    hash: the SuperLink would not take ``m`` twice)."""
    return FlowerMessage(content=m.content, dst_node_id=m.metadata.dst_node_id,
                         message_type=m.metadata.message_type, group_id=m.metadata.group_id)
