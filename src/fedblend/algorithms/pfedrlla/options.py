"""pFedRLLA's options (the ``[options]`` table of ``pfedrlla``): read by the method
(:mod:`fedblend.algorithms.pfedrlla`) and by its learner (:mod:`fedblend.algorithms.pfedrlla.learner`). Defaults: the
paper, then the authors' code (notes) where the paper is silent; ``docs/methods/pfedrlla.md`` lists the choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedblend.algorithms.pfedrlla import embedding
from fedblend.common.options import ConfigError, opt


@dataclass(frozen=True)
class PFedRLLAOptions:
    """Defaults: the paper, then the authors' code (notes) where the paper is silent."""

    CHOICES: ClassVar[dict] = {"embedding": embedding.KINDS, "head": ("fc", "model"),
                               "body": ("size", "mean", "local"), "head_weights": ("agent", "mean"),
                               "agent_scope": ("head", "all"), "r3_norm": ("squared", "plain"),
                               "storage": ("trained", "uploads", "aggregated")}
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
    storage: str = opt("uploads", 'what K\' holds: Alg. 1\'s uploads (paper), the "aggregated" models the server '
                                  'sent (Alg. 1 line 6 read as an assignment) or "trained" models (code; docstring)')
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
    agent: str = opt("", 'a pre-trained agent file (``fedblend pretrain``); "" = no pre-training', file=True)
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
