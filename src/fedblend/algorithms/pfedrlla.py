"""pFedRLLA (ICLR 2024 submission, "Reinforcement learning-based layer-wise aggregation for personalized FL").

Every round (paper Alg. 1) ``K = ceil(cN)`` clients are selected. Two exchanges:

* ``"upload"`` (Alg. 1 line 3): each selected client uploads its current model (its model after its last local
  training; paper Sec. 3: before their first round clients train the initial model locally,
  ``initial_training``) with its data size and ``acc_pre``, the accuracy of that model on its validation split.
  The server embeds the heads (line 4, :mod:`fedblend.algorithms.parts.rl.embedding`) and, for every selected ``k``,
  forms the agent state ``S_k = [e_k' for k' in K'] + [e_k]`` (Alg. 2 line 3) and the action ``A_k`` (line 4).
* ``"train"`` (Alg. 1 lines 5-13): the server sends ``k`` its personalized model (Alg. 2):
  body ``Psi_k = rho_k Psi_k + sum_k' rho_k' Psi_k'`` with ``rho = d / (d_k + sum d_k')`` (lines 1-2), head
  ``Phi_k = p_k Phi_k + sum_k' p_k' Phi_k'`` with ``A_k = (p_k'..., p_k)`` (line 5). The client scores it on its
  validation split (``acc_agg``), trains it locally, and replies. The server computes the reward (Eq. 1)
  ``R = b1 r1 + b2 r2 + b3 r3``, ``r1 = exp(acc_agg - acc_tar) - 1``, ``r2 = acc_agg - acc_pre``,
  ``r3 = -||A_k - V_k||^2`` with ``V_k`` of Eq. 2, stores ``(S_k, A_k, R)`` in the replay buffer and, on the
  schedule, updates the DDPG agent (:mod:`fedblend.algorithms.parts.rl.ddpg`) and the embedding network.
  ``K'`` (the previous round's participants; first round: ``K' = K``, Alg. 1 footnote) is then replaced by ``K``.

What ``K'`` stores (``storage``): ``"uploads"`` (default, Alg. 1 lines 3 and 9): the models the previous
participants uploaded at the start of the previous round (the training reply carries no model). ``"trained"``:
the models they sent after their local training in the previous round -- what the authors' PFLlib-based loop
receives, i.e. their current models (the training reply carries the model).

There is no global model; a client evaluates its own current model (after its last local training). All
learner state (embedding network, agent, Adam moments, replay buffer) is in the server state; randomness
(exploration noise, random actions, replay batches, initialisation) comes from the server's seed-tree streams.
See ``docs/methods/pfedrlla.md`` for paper vs code choices.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from fedblend.algorithms.parts.rl import ddpg, embedding
from fedblend.algorithms.parts.rl.agent_file import AGENT_FIX, AgentFileError, load_agent, save_agent, shape_mismatch
from fedblend.algorithms.parts.rl.rewards import (
    body_weights,
    head_layers,
    mix,
    reward,
    reward_terms,
    similarity_target,
    validation_accuracy,
)
from fedblend.algorithms.registry import register_method
from fedblend.common.options import ConfigError, opt
from fedblend.common.params import Params, layer_of
from fedblend.core.method import ClientCtx, ClientWork, Message, Method, ServerCtx, State
from fedblend.core.training import TrainResult
from fedblend.models.zoo import FedModel


@dataclass(frozen=True)
class PFedRLLAOptions:
    """Defaults: the paper, then the authors' code (notes) where the paper is silent."""

    CHOICES: ClassVar[dict] = {"embedding": embedding.KINDS, "head": ("fc", "model"),
                               "body": ("size", "mean", "local"), "head_weights": ("agent", "mean"),
                               "agent_scope": ("head", "all"), "r3_norm": ("squared", "plain"),
                               "storage": ("trained", "uploads")}
    RANGES: ClassVar[dict] = {"emb_dim": "[1, 1024]", "factor": "[1, 128]", "ae_lr": "> 0", "ae_steps": "[0, 100000]",
                              "ae_every_round_until": "[0, 1000000]", "ae_every": "[1, 1000000]", "acc_tar": "(0, 1]",
                              "hidden": "[1, 4096]", "gamma": "[0, 1]", "polyak": "[0, 1]", "actor_lr": "> 0",
                              "critic_lr": "> 0", "buffer": "[1, 10000000]", "batch": "[1, 1000000]", "noise": ">= 0",
                              "random_rounds": "[0, 1000000]", "update_every": "[1, 1000000]", "updates": "[0, 100000]",
                              "finetune_updates": "[0, 100000]"}

    # aggregation and its ablations (Table 2 / Table 7)
    body: str = opt("size", '"size": Alg. 2 lines 1-2; "mean": plain mean; "local": own body (pre-training, App. D)')
    head_weights: str = opt("agent", '"agent": Alg. 2 lines 3-5; "mean": plain mean over [K\'..., k]')
    agent_scope: str = opt("head", '"head": the agent\'s weights aggregate the head (paper); "all": the whole network '
                                   '("DRL" column)')
    head: str = opt("fc", '"fc": trailing linear layers (code: both fc layers of the CNN); "model": model.head_layers')
    storage: str = opt("uploads", 'what K\' holds: Alg. 1\'s uploads (paper) or "trained" models (code; docstring)')
    initial_training: bool = opt(True, "Sec. 3: a client trains the initial model locally before its first upload")
    # embedding network (Sec. 3.1, notes)
    embedding: str = opt("mhae", '"mhae": the multi-head (LSTM) auto-encoder over the head\'s layers (Sec. 3.1); '
                                 '"flat": the same layer factors through an MLP auto-encoder; "pca": flattened head, '
                                 "PCA (Fig. 6)")
    emb_dim: int = opt(128, "size of a client's embedding: the encoder's hidden units (notes: 128)")
    factor: int = opt(32, "f: each head layer's weight matrix is projected to an f x f factor (notes: 32)")
    ae_lr: float = opt(5e-3, "Adam learning rate of the auto-encoder")
    ae_steps: int = opt(1, "Adam steps per auto-encoder training event (not stated; one step on the round's uploads)")
    ae_every_round_until: int = opt(100, "without pre-training: train the auto-encoder every round up to this round "
                                         "(notes), then every ae_every rounds")
    ae_every: int = opt(10, "auto-encoder training every k rounds after ae_every_round_until (App. E: every 10 rounds "
                            "when fine-tuning)")
    # reward (Eq. 1-2, Table 5)
    beta: tuple[float, ...] = opt((1.0, 1.0, 2.0), "reward weights (b1, b2, b3) of r1 (accuracy), r2 and r3 "
                                                   "(Eq. 1-2, Table 5)")
    acc_tar: float = opt(1.0, "target accuracy of r1; authors' code: exp(acc - 1) - 1")
    r3_norm: str = opt("squared", 'paper Eq. 1d; "plain": the code\'s unsquared norm')
    # DDPG (notes)
    hidden: int = opt(256, "width of the actor's and the critic's two hidden layers")
    gamma: float = opt(0.9, "kept for the record: one-step episodes make the bootstrap term vanish (rl/ddpg.py)")
    polyak: float = opt(0.96, "soft update factor of the target networks after every DDPG step")
    actor_lr: float = opt(1e-3, "Adam learning rate of the actor")
    critic_lr: float = opt(1e-3, "Adam learning rate of the critic")
    buffer: int = opt(100_000, "replay buffer capacity (transitions)")
    batch: int = opt(32, "replay batch size of a DDPG step")
    noise: float = opt(0.03, "std of the Gaussian exploration noise on the actor's weights (then clipped at 0 and "
                             "renormalised)")
    # schedule (App. E and G / notes)
    agent: str = opt("", 'a pre-trained agent file (``fedblend pretrain``); "" = no pre-training')
    random_rounds: int = opt(50, "without pre-training: random actions in the first rounds")
    update_every: int = opt(10, "agent updates every k rounds")
    updates: int = opt(5, "DDPG steps per update event without pre-training (notes)")
    finetune_updates: int = opt(1, "with a pre-trained agent: one batch of 32 every 10 rounds (App. E)")

    def validate(self, where: str) -> None:
        if len(self.beta) != 3 or any(b < 0 for b in self.beta):
            raise ConfigError(f"{where}.beta must be three weights >= 0 (b1, b2, b3), got {list(self.beta)}")

    @property
    def embed(self) -> embedding.EmbedConfig:
        return embedding.EmbedConfig(self.embedding, self.emb_dim, self.factor, self.ae_lr)


# ------------------------------------------------------------------------------------------------ the method
@register_method
class PFedRLLA(Method):
    name = "pfedrlla"
    options_cls = PFedRLLAOptions
    paper = ("Reinforcement learning-based layer-wise aggregation for personalized federated learning "
             "(pFedRLLA, ICLR 2024 submission)")
    eval_model = "each client's current model (its personalized model after its last local training)"
    evaluates_own_model = True  # a client evaluates its own current model
    has_global = False
    pretrainable = True  # App. D: the agent is pre-trained on a run whose bodies stay local

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
            data = load_agent(self.opts.agent)
            emb = data["embed"]
            mine = embedding.signature({"kind": self.opts.embedding, "dim": self.opts.emb_dim,
                                        "factor": self.opts.factor, "shapes": shapes})
            try:
                theirs = embedding.signature(emb)
            except (KeyError, TypeError, ValueError) as exc:
                raise AgentFileError(f"options.agent = {self.opts.agent!r}: its embedding network has no valid "
                                     f"description ({type(exc).__name__}: {exc}); {AGENT_FIX}") from exc
            if theirs != mine:
                raise AgentFileError(
                    f"options.agent = {self.opts.agent!r}: its embedding network (kind, dim, factor, head layer "
                    f"matrices) is {theirs}, this run needs {mine} (a different model, head "
                    "layers or embedding options); pre-train with the same model and options")
            self.check_agent_file(data, shapes)
            return {**server, "embed": emb, "agent": data["agent"], "pretrained": True}
        return {**server, "embed": embedding.init_embedder(shapes, sctx.tree.torch("embedder-init"), self.opts.embed)}

    def check_agent_file(self, data: dict, shapes: list) -> None:
        """Every tensor of a loaded agent file has the shape this run's networks have (the embedding network for
        the run's head layers, the DDPG agent for the state and action sizes the file declares), so a damaged or
        foreign file fails here, naming the tensor, instead of inside torch in round 1."""
        gen = torch.Generator().manual_seed(0)
        where = f"options.agent = {self.opts.agent!r}"
        wrong = shape_mismatch(embedding.init_embedder(shapes, gen, self.opts.embed), data["embed"])
        agent = data["agent"]
        if wrong is None:
            try:
                obs_dim, act_dim = int(agent["obs_dim"]), int(agent["act_dim"])
            except (KeyError, TypeError, ValueError):
                wrong = "obs_dim / act_dim: missing"
            else:
                if obs_dim < 1 or act_dim < 1:
                    wrong = f"obs_dim {obs_dim}, act_dim {act_dim}: must be >= 1"
                else:
                    ref = ddpg.init_agent(obs_dim, act_dim, gen, self.opts)
                    wrong = shape_mismatch(ref, agent, "agent", free=("agent.buffer",))
        if wrong is not None:
            raise AgentFileError(f"{where} does not fit this run: {wrong}; {AGENT_FIX}")

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
            out, rnd = self.choose_actions(out, rnd, sctx)
        out["round"] = rnd
        return out

    def choose_actions(self, server: State, rnd: State, sctx: ServerCtx) -> tuple[State, State]:
        t0 = time.perf_counter()
        groups = self.head_groups(sctx.model)
        mats = [embedding.layer_matrices(p, groups) for p in list(rnd["prev_params"]) + list(rnd["params"])]
        emb_state = server["embed"]
        e = embedding.embed(emb_state, mats)
        n_prev = len(rnd["prev_cids"])
        e_prev, e_up = e[:n_prev], e[n_prev:]
        t = sctx.rnd + 1
        if emb_state["kind"] != "pca" and self.ae_due(t, server["pretrained"]):
            x = embedding.project(emb_state, mats[n_prev:])
            emb_state, loss = embedding.train(emb_state, x, self.opts.ae_steps, self.opts.ae_lr)
            sctx.stats["ae_loss"] = loss
        t1 = time.perf_counter()
        agent = server["agent"]
        obs_dim, act_dim = (n_prev + 1) * e.shape[1], n_prev + 1
        if agent is None:
            agent = ddpg.init_agent(obs_dim, act_dim, sctx.tree.torch("agent-init"), self.opts)
        elif (int(agent["obs_dim"]), int(agent["act_dim"])) != (obs_dim, act_dim):
            src = f"the pre-trained agent {self.opts.agent!r}" if server["pretrained"] else "the agent"
            raise (AgentFileError if server["pretrained"] else ValueError)(
                f"{src} takes {int(agent['act_dim']) - 1} previous participants + 1 (state {int(agent['obs_dim'])}), "
                f"but round {t} has |K'| = {n_prev} (state {obs_dim}); pFedRLLA needs the same number of clients every "
                "round (sampling.scheme = 'fixed') and the same join ratio, clients and embedding size as the "
                "pre-training run")
        obs = torch.stack([torch.cat([e_prev.reshape(-1), e_up[i]]) for i in range(len(rnd["cids"]))])
        random_phase = not server["pretrained"] and sctx.rnd < self.opts.random_rounds
        with torch.no_grad():
            mu = ddpg.policy(agent["actor"], obs)
        actions = []
        for i, cid in enumerate(rnd["cids"]):
            gen = sctx.tree.torch("action", cid)
            actions.append(ddpg.random_action(act_dim, gen) if random_phase
                           else ddpg.explore(mu[i], self.opts.noise, gen))
        targets = torch.stack([similarity_target(e_prev, e_up[i]) for i in range(len(rnd["cids"]))])
        sctx.stats["server_embedding_seconds"] = t1 - t0
        sctx.stats["server_agent_seconds"] = time.perf_counter() - t1
        rnd = {**rnd, "obs": obs, "actions": torch.stack(actions), "targets": targets}
        return {**server, "embed": emb_state, "agent": agent}, rnd

    def ae_due(self, t: int, pretrained: bool) -> bool:
        """Auto-encoder schedule: every round up to ``ae_every_round_until`` without pre-training (notes), and
        every ``ae_every`` rounds otherwise (App. E)."""
        return (not pretrained and t <= self.opts.ae_every_round_until) or t % self.opts.ae_every == 0

    def agent_updates_due(self, t: int, pretrained: bool) -> int:
        """DDPG steps after round ``t``: pre-trained: ``finetune_updates`` every ``update_every`` rounds (App. E);
        otherwise none during the random-action rounds, then ``updates`` every ``update_every`` rounds (notes)."""
        if t % self.opts.update_every:
            return 0
        if pretrained:
            return self.opts.finetune_updates
        return self.opts.updates if t >= self.opts.random_rounds else 0

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """Alg. 2: client ``cid``'s personalized model from K' (stored) and its own upload."""
        t0 = time.perf_counter()
        rnd = server["round"]
        i = rnd["cids"].index(cid)
        models = list(rnd["prev_params"]) + [rnd["params"][i]]
        body_w, head_w = self.decision_weights(rnd, i)
        head = {n for g in self.head_groups(sctx.model) for n in g}
        names = list(sctx.run.init_params)
        params = {**mix(models, body_w, [n for n in names if n not in head]), **mix(models, head_w, sorted(head))}
        sctx.stats["server_aggregation_seconds"] = sctx.stats.get("server_aggregation_seconds", 0.0) + (
            time.perf_counter() - t0)
        return Message({"params": {n: params[n] for n in names}})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Rewards (Eq. 1), replay buffer, agent updates; K' <- K (Alg. 1 lines 8-9)."""
        rnd = server["round"]
        cids = rnd["cids"]
        out = {**server, "round": None}
        if rnd.get("actions") is not None:
            out = self.learn(out, rnd, replies, sctx)
        else:
            sctx.stats["head_weights"] = [[c, [1.0 / (len(rnd["prev_cids"]) + 1)] * (len(rnd["prev_cids"]) + 1)]
                                          for c in cids]
        kept = [replies[c].params() for c in cids] if self.opts.storage == "trained" else rnd["params"]
        out["store"] = {"cids": list(cids), "params": kept, "sizes": list(rnd["sizes"])}
        sctx.stats["acc_agg"] = sum(float(replies[c].metrics["acc_agg"]) for c in cids) / len(cids)
        return out

    def learn(self, server: State, rnd: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        t0 = time.perf_counter()
        terms = [reward_terms(float(replies[c].metrics["acc_agg"]), rnd["acc_pre"][i], rnd["actions"][i],
                              rnd["targets"][i], self.opts.acc_tar, self.opts.r3_norm)
                 for i, c in enumerate(rnd["cids"])]
        rewards = [reward(tr, self.opts.beta) for tr in terms]
        agent = ddpg.store(server["agent"], rnd["obs"], rnd["actions"], torch.tensor(rewards), self.opts.buffer)
        t = sctx.rnd + 1
        for u in range(self.agent_updates_due(t, server["pretrained"])):
            agent, info = ddpg.update(agent, sctx.tree.torch("replay", u), self.opts)
            sctx.stats.update({f"agent_{k}": v for k, v in info.items()})
        n = len(rewards)
        sctx.stats.update(reward=sum(rewards) / n, rewards=rewards, r1=sum(x[0] for x in terms) / n,
                          r2=sum(x[1] for x in terms) / n, r3=sum(x[2] for x in terms) / n,
                          head_prev_cids=list(rnd["prev_cids"]),
                          head_weights=[[c, rnd["actions"][i].tolist()] for i, c in enumerate(rnd["cids"])])
        sctx.stats["server_agent_seconds"] = sctx.stats.get("server_agent_seconds", 0.0) + time.perf_counter() - t0
        return {**server, "agent": agent}

    # ------------------------------------------------------------------------------------------ client
    def client_step(self, phase: str, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        if phase == "upload":
            return self.client_upload(msg, cstate, ctx)
        return super().client_step(phase, msg, cstate, ctx)

    def client_upload(self, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        """Alg. 1 line 3: the current model, the data size and ``acc_pre`` (Eq. 1c) on the validation split."""
        if self.opts.initial_training and not cstate.get("trained"):
            res = yield self.train_spec(cstate["params"], msg, cstate, ctx, stream="initial")
            cstate = {**self.record_training(res, cstate, ctx), "params": res.params, "trained": True}
        acc = validation_accuracy(ctx.model, cstate["params"], ctx.data)
        return Message({"params": cstate["params"]}, {"num_samples": ctx.data.num_train, "acc_pre": acc}), cstate

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """Train the received model locally (Alg. 1 line 12)."""
        res, cstate = yield from super().local_training(params, msg, cstate, ctx)
        return res, {**cstate, "trained": True}

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The trained model (none with ``storage = "uploads"``) and the received model's score ``acc_agg``
        (Eq. 1b-1c; the received model is not changed by training, so scoring it here equals scoring it first)."""
        reply = super().reply(res, msg, cstate, ctx)
        reply.metrics["acc_agg"] = validation_accuracy(ctx.model, msg.params(), ctx.data)
        if self.opts.storage == "uploads":
            reply.arrays = {}
        return reply


def pretrain_options(options: Mapping) -> dict:
    """The run options of a pre-training run (App. D): the body stays local, the head is aggregated by the agent."""
    return {**dict(options), "body": "local", "head_weights": "agent", "agent_scope": "head", "agent": ""}


__all__ = ["PFedRLLA", "PFedRLLAOptions", "body_weights", "head_layers", "load_agent", "mix", "pretrain_options",
           "reward", "reward_terms", "save_agent", "similarity_target"]
