"""pFedRLLA (ICLR 2024 submission, "Reinforcement learning-based layer-wise aggregation for personalized FL").

Every round (paper Alg. 1) ``K = ceil(cN)`` clients are selected. Two exchanges:

* ``"upload"`` (Alg. 1 line 3): each selected client uploads its current model (its model after its last local
  training; paper Sec. 3: before their first round clients train the initial model locally,
  ``initial_training``) with its data size and ``acc_pre``, the accuracy of that model on its validation split.
  The server embeds the heads (line 4, :mod:`fedblend.algorithms.pfedrlla.embedding`) and, for every selected ``k``,
  forms the agent state ``S_k = [e_k' for k' in K'] + [e_k]`` (Alg. 2 line 3) and the action ``A_k`` (line 4).
* ``"train"`` (Alg. 1 lines 5-13): the server sends ``k`` its personalized model (Alg. 2):
  body ``Psi_k = rho_k Psi_k + sum_k' rho_k' Psi_k'`` with ``rho = d / (d_k + sum d_k')`` (lines 1-2), head
  ``Phi_k = p_k Phi_k + sum_k' p_k' Phi_k'`` with ``A_k = (p_k'..., p_k)`` (line 5). The client scores it on its
  validation split (``acc_agg``), trains it locally, and replies. The server computes the reward (Eq. 1)
  ``R = b1 r1 + b2 r2 + b3 r3``, ``r1 = exp(acc_agg - acc_tar) - 1``, ``r2 = acc_agg - acc_pre``,
  ``r3 = -||A_k - V_k||^2`` with ``V_k`` of Eq. 2, stores ``(S_k, A_k, R)`` in the replay buffer and, on the
  schedule, updates the DDPG agent (:mod:`fedblend.algorithms.pfedrlla.ddpg`) and the embedding network.
  ``K'`` (the previous round's participants; first round: ``K' = K``, Alg. 1 footnote) is then replaced by ``K``.

What ``K'`` stores (``storage``): ``"uploads"`` (default, Alg. 1 lines 3 and 9): the models the previous
participants uploaded at the start of the previous round (the training reply carries no model). ``"aggregated"``:
the personalized models the server sent them in the previous round -- Alg. 1 line 6 (``w_k <- Aggregation(k,
K')``) read as an assignment to the server's ``w_k``, which Alg. 2 then reads as ``Psi_k'`` (no model in the
reply either). ``"trained"``: the models they sent after their local training in the previous round -- what the
authors' PFLlib-based loop receives, i.e. their current models (the training reply carries the model).

There is no global model; a client evaluates its own current model (after its last local training). All
learner state (embedding network, agent, Adam moments, replay buffer) is in the server state; randomness
(exploration noise, random actions, replay batches, initialisation) comes from the server's seed-tree streams.
The agent's side (loading a pre-trained agent, embedding, actions, rewards, updates and their schedules) is
:mod:`fedblend.algorithms.pfedrlla.learner`; the options are :mod:`fedblend.algorithms.pfedrlla.options`. See
``docs/methods/pfedrlla.md`` for paper vs code choices.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from fedblend.algorithms.pfedrlla import embedding, learner
from fedblend.algorithms.pfedrlla.agent_file import load_agent, save_agent
from fedblend.algorithms.pfedrlla.options import PFedRLLAOptions
from fedblend.algorithms.pfedrlla.rewards import (
    body_weights,
    head_layers,
    mix,
    reward,
    reward_terms,
    similarity_target,
    validation_accuracy,
)
from fedblend.algorithms.registry import register_method
from fedblend.common.params import Params, layer_of
from fedblend.core.method import ClientCtx, ClientWork, Message, Method, ServerCtx, State, Traits
from fedblend.core.template import record_training, train_spec
from fedblend.core.training import TrainResult
from fedblend.models.zoo import FedModel


# ------------------------------------------------------------------------------------------------ the method
@register_method
class PFedRLLA(Method):
    name = "pfedrlla"
    display_name = "pFedRLLA"
    options_cls = PFedRLLAOptions
    paper = ("Reinforcement learning-based layer-wise aggregation for personalized federated learning "
             "(pFedRLLA, ICLR 2024 submission)")

    def declare(self, choice: str) -> Traits:
        return Traits(global_model=False, evaluates_own_model=True)  # a client evaluates its own current model

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's current model (its personalized model after its last local training)"}

    # App. D: the agent is pre-trained on a run whose bodies stay local (``fedblend pretrain``)

    @classmethod
    def pretrain_options(cls, options: Mapping) -> dict:
        return pretrain_options(options)

    @classmethod
    def save_pretrained(cls, server: State, path: str | Path) -> Path:
        return save_agent(server, path)

    def phases(self, sctx: ServerCtx) -> Sequence[str]:
        return ("upload", "train")

    def head_groups(self, model: FedModel) -> list[list[str]]:
        """Parameter names of each head layer, in layer order (the embedding network's "heads")."""
        layers = head_layers(model, self.opts.head)
        names = model.param_names(layers)
        return [[n for n in names if layer_of(n) == ly] for ly in layers]

    def uses_agent(self) -> bool:
        return self.opts.head_weights == "agent" or self.opts.agent_scope == "all"

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        server: State = {"embed": None, "agent": None, "store": None, "round": None, "pretrained": False}
        if not self.uses_agent():
            return server
        groups = self.head_groups(sctx.model)
        shapes = [tuple(m.shape) for m in embedding.layer_matrices(sctx.run.init_params, groups)]
        if self.opts.agent:
            emb, agent = learner.load_pretrained(self.opts, shapes)
            return {**server, "embed": emb, "agent": agent, "pretrained": True}
        return {**server, "embed": embedding.init_embedder(shapes, sctx.tree.torch("embedder-init"), self.opts.embed)}

    def configure(self, phase: str, server: State, cid: int, sctx: ServerCtx) -> Message:
        if phase == "upload":
            return Message()
        return super().configure(phase, server, cid, sctx)

    def aggregate(self, phase: str, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        if phase == "upload":
            return self.aggregate_upload(server, replies, sctx)
        return super().aggregate(phase, server, replies, sctx)

    def decision_weights(self, rnd: State, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(body weights, head weights) over ``[K'..., k]`` for the ``i``-th client of the round."""
        n = len(rnd["prev_sizes"]) + 1
        body = body_weights(list(rnd["prev_sizes"]) + [rnd["sizes"][i]], self.opts.body)
        head = rnd["actions"][i].double() if rnd.get("actions") is not None else torch.full((n,), 1.0 / n,
                                                                                           dtype=torch.float64)
        if self.opts.agent_scope == "all":
            body = head
        return body, head

    def aggregate_upload(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Alg. 1 lines 3-4 and Alg. 2 lines 3-4: embed the uploads and K', and choose every client's action."""
        cids = sorted(replies)
        ups = [replies[c].params() for c in cids]
        sizes = [float(replies[c].metrics["num_samples"]) for c in cids]
        store = server["store"] or {"cids": cids, "params": ups, "sizes": sizes}  # first round: K' = K
        rnd: State = {"cids": cids, "params": ups, "sizes": sizes,
                      "acc_pre": [float(replies[c].metrics["acc_pre"]) for c in cids],
                      "prev_cids": list(store["cids"]), "prev_params": store["params"],
                      "prev_sizes": list(store["sizes"]), "actions": None}
        out = {**server}
        if self.uses_agent():
            out, rnd = learner.choose_actions(self.opts, out, rnd, self.head_groups(sctx.model), sctx)
        out["round"] = rnd
        return out

    def personalized(self, rnd: State, i: int, sctx: ServerCtx) -> Params:
        """Alg. 2: the ``i``-th participant's personalized model from K' (stored) and its own upload."""
        models = list(rnd["prev_params"]) + [rnd["params"][i]]
        body_w, head_w = self.decision_weights(rnd, i)
        head = {n for g in self.head_groups(sctx.model) for n in g}
        names = list(sctx.run.init_params)
        params = {**mix(models, body_w, [n for n in names if n not in head]), **mix(models, head_w, sorted(head))}
        return {n: params[n] for n in names}

    def timed_personalized(self, rnd: State, i: int, sctx: ServerCtx) -> Params:
        """:meth:`personalized`, its time added to the round's ``server_aggregation_seconds`` (App. E's split)."""
        t0 = time.perf_counter()
        params = self.personalized(rnd, i, sctx)
        sctx.stats["server_aggregation_seconds"] = sctx.stats.get("server_aggregation_seconds", 0.0) + (
            time.perf_counter() - t0)
        return params

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """Alg. 1 line 6: send client ``cid`` its personalized model (Alg. 2)."""
        rnd = server["round"]
        return Message({"params": self.timed_personalized(rnd, rnd["cids"].index(cid), sctx)})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Rewards (Eq. 1), replay buffer, agent updates; K' <- K (Alg. 1 lines 8-9)."""
        rnd = server["round"]
        cids = rnd["cids"]
        out = {**server, "round": None}
        if rnd.get("actions") is not None:
            out = learner.learn(self.opts, out, rnd, replies, sctx)
        else:
            sctx.stats["head_weights"] = [[c, [1.0 / (len(rnd["prev_cids"]) + 1)] * (len(rnd["prev_cids"]) + 1)]
                                          for c in cids]
        kept = self.kept_models(rnd, replies, sctx)
        out["store"] = {"cids": list(cids), "params": kept, "sizes": list(rnd["sizes"])}
        sctx.stats["acc_agg"] = sum(float(replies[c].metrics["acc_agg"]) for c in cids) / len(cids)
        return out

    def kept_models(self, rnd: State, replies: Mapping[int, Message], sctx: ServerCtx) -> list[Params]:
        """The models ``K'`` holds next round (``storage``): the round's uploads, the personalized models sent
        (recomputed: Alg. 2 is deterministic given the round's actions), or the trained models in the replies."""
        if self.opts.storage == "trained":
            return [replies[c].params() for c in rnd["cids"]]
        if self.opts.storage == "aggregated":
            return [self.timed_personalized(rnd, i, sctx) for i in range(len(rnd["cids"]))]
        return rnd["params"]

    # ------------------------------------------------------------------------------------------ client
    def client_step(self, phase: str, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        if phase == "upload":
            return self.client_upload(msg, cstate, ctx)
        return super().client_step(phase, msg, cstate, ctx)

    def client_upload(self, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        """Alg. 1 line 3: the current model, the data size and ``acc_pre`` (Eq. 1c) on the validation split."""
        if self.opts.initial_training and not cstate.get("trained"):
            res = yield train_spec(self, cstate["params"], msg, cstate, ctx, stream="initial")
            cstate = {**record_training(res, cstate, ctx), "params": res.params, "trained": True}
        acc = validation_accuracy(ctx.model, cstate["params"], ctx.data)
        return Message({"params": cstate["params"]}, {"num_samples": ctx.data.num_train, "acc_pre": acc}), cstate

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """Train the received model locally (Alg. 1 line 12)."""
        res, cstate = yield from super().local_training(params, msg, cstate, ctx)
        return res, {**cstate, "trained": True}

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The trained model (only with ``storage = "trained"``) and the received model's score ``acc_agg``
        (Eq. 1b-1c; the received model is not changed by training, so scoring it here equals scoring it first)."""
        reply = super().reply(res, msg, cstate, ctx)
        reply.metrics["acc_agg"] = validation_accuracy(ctx.model, msg.params(), ctx.data)
        if self.opts.storage != "trained":
            reply.arrays = {}
        return reply


def pretrain_options(options: Mapping) -> dict:
    """The run options of a pre-training run (App. D): the body stays local, the head is aggregated by the agent."""
    return {**dict(options), "body": "local", "head_weights": "agent", "agent_scope": "head", "agent": ""}


__all__ = ["PFedRLLA", "PFedRLLAOptions", "body_weights", "head_layers", "load_agent", "mix", "pretrain_options",
           "reward", "reward_terms", "save_agent", "similarity_target"]
