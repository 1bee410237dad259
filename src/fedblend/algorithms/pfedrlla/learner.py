"""pFedRLLA's server-side learner: the embedding network and the DDPG agent across rounds (paper Alg. 1 lines 4
and 10-11, Alg. 2 lines 3-4, App. D-G; notes "pFedRLLA").

The method module (:mod:`fedblend.algorithms.pfedrlla`) owns the federated protocol (who sends what, the
personalized models of Alg. 2); this module owns what the agent does with it, as functions of the method's
options and the server state:

* :func:`load_pretrained` -- a pre-trained agent file, checked against this run's networks (App. D);
* :func:`choose_actions` -- embed the uploads and ``K'``, train the embedding network on schedule, and choose
  every selected client's head weights ``A_k`` (random during the first rounds without pre-training, App. G);
* :func:`learn` -- the rewards of Eq. 1, the replay buffer and the DDPG updates on schedule;
* :func:`ae_due`, :func:`agent_updates_due` -- the schedules (App. E, notes).

Timing of the server's parts goes to ``sctx.stats`` (``server_embedding_seconds``, ``server_agent_seconds``), as
App. E reports it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from fedblend.algorithms.pfedrlla import ddpg, embedding
from fedblend.algorithms.pfedrlla.agent_file import AGENT_FIX, AgentFileError, load_agent, shape_mismatch
from fedblend.algorithms.pfedrlla.options import PFedRLLAOptions as Options
from fedblend.algorithms.pfedrlla.rewards import reward, reward_terms, similarity_target
from fedblend.common.codec import to_device

State = dict


def load_pretrained(opts: Options, shapes: list[tuple[int, ...]]) -> tuple[dict, dict]:
    """(embedding network, agent) of the agent file ``opts.agent``, after checking that its embedding network
    is the one this run builds (kind, size, head layer matrices) and every tensor has this run's shape."""
    data = load_agent(opts.agent)
    emb = data["embed"]
    mine = embedding.signature({"kind": opts.embedding, "dim": opts.emb_dim, "factor": opts.factor, "shapes": shapes})
    try:
        theirs = embedding.signature(emb)
    except (KeyError, TypeError, ValueError) as exc:
        raise AgentFileError(f"options.agent = {opts.agent!r}: its embedding network has no valid "
                             f"description ({type(exc).__name__}: {exc}); {AGENT_FIX}") from exc
    if theirs != mine:
        raise AgentFileError(
            f"options.agent = {opts.agent!r}: its embedding network (kind, dim, factor, head layer "
            f"matrices) is {theirs}, this run needs {mine} (a different model, head "
            "layers or embedding options); pre-train with the same model and options")
    check_agent_file(opts, data, shapes)
    return emb, data["agent"]


def check_agent_file(opts: Options, data: dict, shapes: list) -> None:
    """Every tensor of a loaded agent file has the shape this run's networks have (the embedding network for
    the run's head layers, the DDPG agent for the state and action sizes the file declares), so a damaged or
    foreign file fails here, naming the tensor, instead of inside torch in round 1."""
    gen = torch.Generator().manual_seed(0)
    where = f"options.agent = {opts.agent!r}"
    wrong = shape_mismatch(embedding.init_embedder(shapes, gen, opts.embed), data["embed"])
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
                ref = ddpg.init_agent(obs_dim, act_dim, gen, opts)
                wrong = shape_mismatch(ref, agent, "agent", free=("agent.buffer",))
    if wrong is not None:
        raise AgentFileError(f"{where} does not fit this run: {wrong}; {AGENT_FIX}")


def ae_due(opts: Options, t: int, pretrained: bool) -> bool:
    """Auto-encoder schedule: every round up to ``ae_every_round_until`` without pre-training (notes), and
    every ``ae_every`` rounds otherwise (App. E)."""
    return (not pretrained and t <= opts.ae_every_round_until) or t % opts.ae_every == 0


def agent_updates_due(opts: Options, t: int, pretrained: bool) -> int:
    """DDPG steps after round ``t``: pre-trained: ``finetune_updates`` every ``update_every`` rounds (App. E);
    otherwise none during the random-action rounds, then ``updates`` every ``update_every`` rounds (notes)."""
    if t % opts.update_every:
        return 0
    if pretrained:
        return opts.finetune_updates
    return opts.updates if t >= opts.random_rounds else 0


def new_agent(obs_dim: int, act_dim: int, tree: Any, cfg: ddpg.DDPGConfig) -> dict:
    """A fresh agent, drawn from the server's stream ``agent-init`` of the round that first needs one (round 0:
    ``method.server_tree(SeedTree(seed), 0)``; a pre-training run makes it the same way from its own seed)."""
    return ddpg.init_agent(obs_dim, act_dim, tree.torch("agent-init"), cfg)


def choose_actions(opts: Options, server: State, rnd: State, groups: list[list[str]],
                   sctx: Any) -> tuple[State, State]:
    """Alg. 2 lines 3-4: embed ``K'``'s stored models and the round's uploads (their head layers ``groups``),
    train the embedding network when due, form each selected client's state ``S_k`` and its action ``A_k``
    (the actor's output with exploration noise; uniformly random in the first ``random_rounds`` without a
    pre-trained agent). Returns the new server state and the round record with ``obs``, ``actions``,
    ``targets`` (Eq. 2's ``V_k``)."""
    t0 = time.perf_counter()
    mats = [embedding.layer_matrices(p, groups) for p in list(rnd["prev_params"]) + list(rnd["params"])]
    emb_state = server["embed"]
    e = embedding.embed(emb_state, mats)
    n_prev = len(rnd["prev_cids"])
    e_prev, e_up = e[:n_prev], e[n_prev:]
    t = sctx.rnd + 1
    if emb_state["kind"] != "pca" and ae_due(opts, t, server["pretrained"]):
        x = embedding.project(emb_state, mats[n_prev:])
        emb_state, loss = embedding.train(emb_state, x, opts.ae_steps, opts.ae_lr)
        sctx.stats["ae_loss"] = loss
    t1 = time.perf_counter()
    agent = server["agent"]
    obs_dim, act_dim = (n_prev + 1) * e.shape[1], n_prev + 1
    if agent is None:
        agent = to_device(new_agent(obs_dim, act_dim, sctx.tree, opts), e.device)  # drawn on the CPU, any device
    elif (int(agent["obs_dim"]), int(agent["act_dim"])) != (obs_dim, act_dim):
        src = f"the pre-trained agent {opts.agent!r}" if server["pretrained"] else "the agent"
        raise (AgentFileError if server["pretrained"] else ValueError)(
            f"{src} takes {int(agent['act_dim']) - 1} previous participants + 1 (state {int(agent['obs_dim'])}), "
            f"but round {t} has |K'| = {n_prev} (state {obs_dim}); pFedRLLA needs the same number of clients every "
            "round (sampling.scheme = 'fixed') and the same join ratio, clients and embedding size as the "
            "pre-training run")
    obs = torch.stack([torch.cat([e_prev.reshape(-1), e_up[i]]) for i in range(len(rnd["cids"]))])
    random_phase = not server["pretrained"] and sctx.rnd < opts.random_rounds
    with torch.no_grad():
        mu = ddpg.policy(agent["actor"], obs)
    actions = []
    for i, cid in enumerate(rnd["cids"]):
        gen = sctx.tree.torch("action", cid)
        actions.append(ddpg.random_action(act_dim, gen).to(mu.device) if random_phase
                       else ddpg.explore(mu[i], opts.noise, gen))
    targets = torch.stack([similarity_target(e_prev, e_up[i]) for i in range(len(rnd["cids"]))])
    sctx.stats["server_embedding_seconds"] = t1 - t0
    sctx.stats["server_agent_seconds"] = time.perf_counter() - t1
    rnd = {**rnd, "obs": obs, "actions": torch.stack(actions), "targets": targets}
    return {**server, "embed": emb_state, "agent": agent}, rnd


def learn(opts: Options, server: State, rnd: State, replies: Mapping[int, Any], sctx: Any) -> State:
    """Alg. 1 lines 10-11: each client's reward (Eq. 1) from its ``acc_agg`` and ``acc_pre``, the transitions
    into the replay buffer, and the DDPG updates due this round; the rewards and head weights go to the round's
    stats."""
    t0 = time.perf_counter()
    terms = [reward_terms(float(replies[c].metrics["acc_agg"]), rnd["acc_pre"][i], rnd["actions"][i],
                          rnd["targets"][i], opts.acc_tar, opts.r3_norm)
             for i, c in enumerate(rnd["cids"])]
    rewards = [reward(tr, opts.beta) for tr in terms]
    agent = ddpg.store(server["agent"], rnd["obs"], rnd["actions"], torch.tensor(rewards, device=rnd["obs"].device),
                       opts.buffer)
    t = sctx.rnd + 1
    for u in range(agent_updates_due(opts, t, server["pretrained"])):
        agent, info = ddpg.update(agent, sctx.tree.torch("replay", u), opts)
        sctx.stats.update({f"agent_{k}": v for k, v in info.items()})
    n = len(rewards)
    sctx.stats.update(reward=sum(rewards) / n, rewards=rewards, r1=sum(x[0] for x in terms) / n,
                      r2=sum(x[1] for x in terms) / n, r3=sum(x[2] for x in terms) / n,
                      head_prev_cids=list(rnd["prev_cids"]),
                      head_weights=[[c, rnd["actions"][i].tolist()] for i, c in enumerate(rnd["cids"])])
    sctx.stats["server_agent_seconds"] = sctx.stats.get("server_agent_seconds", 0.0) + time.perf_counter() - t0
    return {**server, "agent": agent}
