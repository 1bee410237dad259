"""DDPG (Lillicrap et al. 2015) for one-step episodes, as pFedRLLA's server-side agent (paper Sec. 3.2.1, App. C).

The agent is data: ``{"actor", "critic", "actor_target", "critic_target"}`` parameter dicts, their Adam states,
and a replay buffer of ``(state, action, reward)`` rows (a ring of ``buffer`` rows). All randomness (exploration
noise, random actions, replay batches) comes from generators the caller passes in (seed-tree streams).

* Actor (notes): MLP ``obs -> 256 -> 256 -> act`` with ReLU, ``tanh`` on the output, then softmax, so an action is
  a weight vector that sums to 1 (paper: "adding a softmax activation function to the final layer").
* Critic: MLP ``[obs, act] -> 256 -> 256 -> 1``.
* One-step episodes (App. C: "each weight aggregation is considered as one task"): every transition is terminal,
  so the critic's target is the reward itself, ``y = r`` (the bootstrap ``gamma * Q'(s', mu'(s'))`` is multiplied
  by ``1 - done = 0``). The target networks are still soft-updated after every step (polyak 0.96), as DDPG
  prescribes, but a one-step target never reads them; ``gamma`` is kept in the options for the record only.
* Critic loss ``mean (Q(s, a) - y)^2``; actor loss ``-mean Q(s, mu(s))`` (deterministic policy gradient).
"""

from __future__ import annotations

from typing import Protocol

import torch

from fedblend.algorithms.parts.nets import Net, mlp, mlp_init, polyak
from fedblend.core.optim import adam_init, minimise


class DDPGConfig(Protocol):
    """The hyperparameters the agent reads (pFedRLLA's options carry them; notes' values as defaults there)."""

    hidden: int  # width of the actor's and critic's two hidden layers (256)
    polyak: float  # soft target update factor (0.96)
    actor_lr: float  # Adam (1e-3)
    critic_lr: float  # Adam (1e-3)
    batch: int  # replay batch (32)


def init_agent(obs_dim: int, act_dim: int, gen: torch.Generator, cfg: DDPGConfig) -> dict:
    h = cfg.hidden
    actor = mlp_init([obs_dim, h, h, act_dim], gen)
    critic = mlp_init([obs_dim + act_dim, h, h, 1], gen)
    return {
        "obs_dim": obs_dim, "act_dim": act_dim,
        "actor": actor, "critic": critic,
        "actor_target": {k: v.clone() for k, v in actor.items()},
        "critic_target": {k: v.clone() for k, v in critic.items()},
        "actor_opt": adam_init(actor), "critic_opt": adam_init(critic),
        "buffer": {"obs": torch.zeros(0, obs_dim), "act": torch.zeros(0, act_dim), "rew": torch.zeros(0),
                   "next": 0},
        "updates": 0,
    }


def policy(actor: Net, obs: torch.Tensor) -> torch.Tensor:
    """``mu(s) = softmax(tanh(MLP(s)))``: a weight vector summing to 1 per row."""
    return torch.softmax(torch.tanh(mlp(actor, obs)), dim=-1)


def q_value(critic: Net, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
    return mlp(critic, torch.cat([obs, act], dim=-1)).squeeze(-1)


def explore(action: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    """Gaussian exploration noise, then clipped at 0 and renormalised so the weights still sum to 1."""
    noisy = (action + std * torch.randn(action.shape, generator=gen).to(action.device)).clamp_min(0.0)
    total = noisy.sum()
    return noisy / total if float(total) > 0 else torch.full_like(action, 1.0 / action.numel())


def random_action(act_dim: int, gen: torch.Generator) -> torch.Tensor:
    """A uniformly random weight vector (the warm-up phase without pre-training, App. G / notes)."""
    u = torch.rand(act_dim, generator=gen)
    return u / u.sum()


def store(agent: dict, obs: torch.Tensor, act: torch.Tensor, rew: torch.Tensor, capacity: int) -> dict:
    """Append rows to the replay buffer; once it holds ``capacity`` rows the oldest are overwritten (a ring)."""
    buf = agent["buffer"]
    o, a, r, nxt = buf["obs"], buf["act"], buf["rew"], int(buf["next"])
    for i in range(obs.shape[0]):
        if o.shape[0] < capacity:
            o, a, r = torch.cat([o, obs[i : i + 1]]), torch.cat([a, act[i : i + 1]]), torch.cat([r, rew[i : i + 1]])
        else:
            o, a, r = o.clone(), a.clone(), r.clone()
            o[nxt], a[nxt], r[nxt] = obs[i], act[i], rew[i]
        nxt = (nxt + 1) % capacity
    return {**agent, "buffer": {"obs": o, "act": a, "rew": r, "next": nxt}}


def update(agent: dict, gen: torch.Generator, cfg: DDPGConfig) -> tuple[dict, dict]:
    """One DDPG step on a replay batch of ``cfg.batch`` rows drawn (with replacement) from ``gen``."""
    buf = agent["buffer"]
    n = buf["obs"].shape[0]
    if n == 0:
        return agent, {}
    idx = torch.randint(0, n, (cfg.batch,), generator=gen)
    obs, act, y = buf["obs"][idx], buf["act"][idx], buf["rew"][idx]  # one-step episodes: y = r
    critic, critic_opt, closs = minimise(agent["critic"], agent["critic_opt"], cfg.critic_lr,
                                         lambda c: ((q_value(c, obs, act) - y) ** 2).mean())
    frozen = {k: v.detach() for k, v in critic.items()}
    actor, actor_opt, aloss = minimise(agent["actor"], agent["actor_opt"], cfg.actor_lr,
                                       lambda a: -q_value(frozen, obs, policy(a, obs)).mean())
    out = {**agent, "actor": actor, "critic": critic, "actor_opt": actor_opt, "critic_opt": critic_opt,
           "actor_target": polyak(agent["actor_target"], actor, cfg.polyak),
           "critic_target": polyak(agent["critic_target"], critic, cfg.polyak),
           "updates": int(agent["updates"]) + 1}
    return out, {"critic_loss": closs, "actor_loss": aloss}
