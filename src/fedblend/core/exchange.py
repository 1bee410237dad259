"""A round's exchanges: the server half ``configure``s a message per joining client, the backend runs the client
halves on them, the replies are checked and the server half ``aggregate``s them -- once per phase of the round
(``method.phases``, one ``"train"`` exchange by default).

Every message is held to the channel rules both ways (:func:`~fedblend.core.message.channel_errors`), every
message of the server half to the model's names, shapes and dtypes, and every training reply to the reply
contract before it is aggregated (:mod:`fedblend.core.replies`: a Message, model parameters of the model's shapes
and a floating dtype, no names the model lacks, a positive ``num_samples``;
:class:`~fedblend.common.errors.MessageError` names the method, client, round and entry). A reply or new client
state with NaN / inf stops the run or is skipped (:mod:`fedblend.core.divergence`); a client with no result
(``None`` from a backend that tolerates faults, e.g. Flower's: node down, timeout, refused reply) is left out
(``dropped_clients``).
"""

from __future__ import annotations

from fedblend.common.codec import to_device
from fedblend.common.errors import MessageError
from fedblend.common.guard import method_guard, returned_wrong
from fedblend.core.client import ClientJob, ClientResult
from fedblend.core.divergence import nonfinite_origin
from fedblend.core.message import Message, channel_errors, first_nonfinite_value
from fedblend.core.method import BEFORE_AFTER, ServerCtx, State
from fedblend.core.replies import check_is_message, check_reply, model_errors, reply_errors
from fedblend.core.returns import returned
from fedblend.core.round_metrics import RoundTally


class Exchanges:
    """The exchanges of :class:`~fedblend.core.engine.Simulation` (a mixin over its fields ``method``,
    ``run_info``, ``fed``, ``backend``, ``store``, ``server``, ``protocol``, ``tree`` and ``on_client``)."""

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

    # ------------------------------------------------------------------------------------------- a round's phases
    def _phases(self, t: int, sctx: ServerCtx) -> tuple[str, ...]:
        """The round's exchanges (``method.phases``), checked to be a non-empty sequence of phase names."""
        with method_guard(self.method, "phases", t):
            return returned(self.method, "phases", self.method.phases(sctx), t)

    def _exchange(self, phase: str, cids: list[int], t: int, sctx: ServerCtx, tally: RoundTally) -> dict[int, Message]:
        """One phase's messages to ``cids``, run on the backend; the accepted replies (checked, finite), whose
        clients' new states are stored and whose stats are tallied."""
        msgs = {}
        for cid in cids:
            with method_guard(self.method, "configure", t, cid):
                msgs[cid] = returned(self.method, "configure", self.method.configure(phase, self.server, cid, sctx), t,
                                     cid)
        if self.protocol.before_after:
            for m in msgs.values():
                m.config[BEFORE_AFTER] = self.protocol.split
        for cid in cids:
            self._check_channels(msgs[cid], phase, cid, reply=False)
            self._check_sent(msgs[cid], "configure", cid, t)
        jobs = [ClientJob(phase, cid, t, msgs[cid], self.store.get(cid)) for cid in cids]
        results = self._run_jobs(jobs)
        replies = {}
        for job, res in zip(jobs, results):
            cid = job.cid
            tally.down[cid] += msgs[cid].num_bytes
            if res is None:  # the client did not answer (node down, timeout, refused reply)
                tally.dropped.append(cid)
                continue
            self._check_channels(res.reply, phase, cid, reply=True, stats=res.stats)
            self._check_reply(res.reply, phase, cid, t)
            tally.up[cid] += res.reply.num_bytes
            tally.answered[phase] = tally.answered.get(phase, 0) + 1
            if self._nonfinite(res, job):
                tally.skipped.append(cid)
                tally.first_skipped = tally.first_skipped or job
                tally.refused[phase] = tally.refused.get(phase, 0) + 1
                continue
            self.store.put(cid, res.state)
            tally.stats[cid].update(res.stats)
            replies[cid] = res.reply
        return replies

    def _aggregate(self, phase: str, replies: dict[int, Message], t: int, sctx: ServerCtx) -> None:
        """The server half's ``aggregate`` of one phase's accepted replies (none: the server keeps its state)."""
        if replies:
            with method_guard(self.method, "aggregate", t):
                server = returned(self.method, "aggregate", self.method.aggregate(phase, self.server, replies, sctx),
                                  t)
            self.server = to_device(self._checked_server(server, "aggregate", t), self.run_info.device)

    def _train_phases(self, t: int, sctx: ServerCtx, tally: RoundTally) -> None:
        """Every phase of round ``t`` in order, each over the clients whose reply the phase before accepted (a
        sequential server aggregates after each client); stops early, with an alarm for the divergence check,
        when the server state turns non-finite or every reply of a phase was skipped as non-finite."""
        phases = self._phases(t, sctx)
        if self.on_client is not None:
            self.on_client("train", len(tally.selected) * len(phases))
        active = list(tally.selected)  # a later phase goes to the clients whose reply the phase before accepted
        for phase in phases:
            accepted: list[int] = []
            before = self.server
            if self.method.traits.sequential_server:
                for cid in active:
                    replies = self._exchange(phase, [cid], t, sctx, tally)
                    self._aggregate(phase, replies, t, sctx)
                    accepted += list(replies)
            else:
                replies = self._exchange(phase, active, t, sctx, tally)
                self._aggregate(phase, replies, t, sctx)
                accepted = list(replies)
            where = first_nonfinite_value(self.server)  # once per phase (a sequential server aggregates per client)
            if where is not None:
                self._alarms.append(f"the server state has NaN or inf values after aggregating the {phase} phase "
                                    f"(in {where})")
                self._origin = self._origin or self._server_origin(before, phase, t)
                break
            answered, refused = tally.answered, tally.refused
            if answered.get(phase) and refused.get(phase) == answered[phase]:
                self._alarms.append(f"every {phase} update of the round ({answered[phase]}) was skipped as "
                                    f"non-finite (on_nonfinite = 'skip'): nothing was aggregated")
                if self.on_divergence == "stop" and self._origin is None:  # the run ends: worth a replay
                    self._origin = nonfinite_origin(self.client_runtime(), tally.first_skipped, self.server)
                break  # the round's later phases have nothing to build on
            active = [c for c in active if c in set(accepted)]
            if not active:
                break
