"""Diagnostics of a pFedRLLA run directory (paper Fig. 2, 3, 6 and App. E).

    python scripts/pfedrlla_plots.py RUN_DIR [--out DIR] [--data-dir DIR]

Writes into DIR (default RUN_DIR):

* ``pfedrlla_reward.png``: the reward of every episode (one episode = one client's aggregation) and its moving
  average (Fig. 2);
* ``pfedrlla_head_weights.png``: the last round's head weights, row k = client k's weights on the previous
  round's participants (its own weight added to its own column), Fig. 3; printed: mean weight on other clients
  that share a class with k vs on those that share none (needs full participation to be a square matrix);
* ``pfedrlla_embeddings.png``: every client's current model embedded by the run's embedding network and by PCA,
  projected to 2-D, coloured by the client's label group (Fig. 6); printed: within / between group distance ratio;
* ``pfedrlla_time.png``: the server's time per round (embedding, agent, aggregation) beside the clients' training
  time (App. E); printed: the server's share.

Printed from the checkpoint's agent (:func:`policy_diagnostics`, over the replay buffer's last states): how much
the state tells clients apart (the spread of the embeddings in a state against their common part, the cosine of a
client's embedding to the previous participants', and how far Eq. 2's target ``V`` is from uniform) and whether
the actor uses it (the share of its ``tanh`` outputs at the bounds, the spread of its weights over states, and
its mean weight per slot), and where the actor's weights come from: the critic's action gradient per slot at the
actor's action (:func:`critic_slot_gradient`; the actor climbs it), for the checkpoint's critic and for the
critic the run's seed draws before any training (:func:`initial_agent`). The three slots the most concentrated
action favours are printed for the actor and for both critics. ``--replay-seeds S ...`` replays the run's DDPG
updates on its own experience from the agents other seeds draw (:func:`replay_report`): whether the action the
actor ends in comes from the experience or from the initial networks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedblend.results.runs import read_metrics  # noqa: E402


def load_history(run: Path) -> list[dict]:
    return read_metrics(run)


def class_sets(run: Path) -> list[frozenset]:
    counts = json.loads((run / "partition.json").read_text())["train_counts"]
    return [frozenset(int(c) for c, n in enumerate(row) if n > 0) for row in counts]


def reward_curve(history: list[dict], out: Path) -> None:
    rewards = [r for m in history for r in m.get("rewards", [])]
    if not rewards:
        print("no rewards recorded (head_weights = 'mean'?)")
        return
    w = max(1, len(rewards) // 20)
    avg = np.convolve(rewards, np.ones(w) / w, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(rewards, ".", ms=2, alpha=0.4, label="episode reward")
    ax.plot(np.arange(w - 1, len(rewards)), avg, label=f"moving average ({w})")
    ax.set_xlabel("episode")
    ax.set_ylabel("reward")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "pfedrlla_reward.png", dpi=120)
    plt.close(fig)
    print(f"reward: first {w} episodes {np.mean(rewards[:w]):.4f}, last {w} {np.mean(rewards[-w:]):.4f}")


def head_weight_matrix(entry: dict, num_clients: int) -> np.ndarray:
    """Row k: client k's head weights on each client (previous participants, its own upload added to column k;
    NaN where a client was not among them)."""
    mat = np.full((num_clients, num_clients), np.nan)
    prev = entry["head_prev_cids"]
    for k, weights in entry["head_weights"]:
        row = np.full(num_clients, np.nan)  # NaN: client j was not in K' for this row
        for j, w in zip(list(prev) + [k], weights):
            row[j] = w + (0.0 if np.isnan(row[j]) else row[j])
        mat[k] = row
    return mat


def head_heatmap(history: list[dict], groups: list[frozenset], out: Path) -> None:
    last = next((m for m in reversed(history) if "head_prev_cids" in m), None)
    if last is None:
        return
    mat = head_weight_matrix(last, len(groups))
    fig, ax = plt.subplots(figsize=(5, 4.5))
    im = ax.imshow(np.ma.masked_invalid(mat), cmap="viridis")
    ax.set_xlabel("contributing client")
    ax.set_ylabel("target client k")
    if len(groups) <= 20:  # few clients (the nine-client experiment): name each one's classes on the axes
        names = [f"{k}: {','.join(map(str, sorted(g)))}" for k, g in enumerate(groups)]
        ax.set_xticks(range(len(groups)), names, rotation=90, fontsize=7)
        ax.set_yticks(range(len(groups)), names, fontsize=7)
        ax.set_xlabel("contributing client: its classes")
        ax.set_ylabel("target client k: its classes")
    ax.set_title(f"pFedRLLA head weights, round {last['round']}", fontsize=9)
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(out / "pfedrlla_head_weights.png", dpi=120)
    plt.close(fig)
    same, other = [], []
    for k in range(len(groups)):
        for j in range(len(groups)):
            if j != k and not np.isnan(mat[k, j]):
                (same if groups[k] & groups[j] else other).append(mat[k, j])
    print(f"head weights, round {last['round']}: mean self {np.nanmean(np.diag(mat)):.4f} (uniform would be "
          f"{1 / len(last['head_weights'][0][1]):.4f}), on clients sharing a "
          f"class {np.mean(same) if same else float('nan'):.4f} ({len(same)} pairs), sharing none "
          f"{np.mean(other) if other else float('nan'):.4f} ({len(other)} pairs)")


def project_2d(e: torch.Tensor) -> np.ndarray:
    x = e.double() - e.double().mean(0)
    u, s, _ = torch.linalg.svd(x, full_matrices=False)
    return (u[:, :2] * s[:2]).numpy()


def group_ratio(e: np.ndarray, labels: list[int]) -> float:
    """Mean distance between clients of the same label group / between clients of different groups."""
    d = np.linalg.norm(e[:, None] - e[None], axis=-1)
    lab = np.array(labels)
    same = (lab[:, None] == lab[None]) & ~np.eye(len(lab), dtype=bool)
    diff = lab[:, None] != lab[None]
    return float(d[same].mean() / d[diff].mean()) if same.any() and diff.any() else float("nan")


def embeddings_plot(run: Path, groups: list[frozenset], out: Path, data_dir: str | None) -> None:
    from fedblend.algorithms.pfedrlla import embedding
    from fedblend.config import load_config
    from fedblend.core.checkpoint import FILENAME, load_checkpoint
    from fedblend.data.federated import dataset_info
    from fedblend.data.sources import load_dataset
    from fedblend.models.zoo import build_model

    ck = load_checkpoint(run / FILENAME)
    emb = ck["server"].get("embed")
    if emb is None:
        print("no embedding network in the checkpoint")
        return
    cfg = load_config(run / "config.toml")
    model = build_model(cfg.model, dataset_info(load_dataset(cfg.dataset, data_dir)))
    groups_of = cfg.build_method().head_groups(model)
    cids = sorted(c for c, st in ck["clients"].items() if st.get("trained"))
    mats = [embedding.layer_matrices(ck["clients"][c]["params"], groups_of) for c in cids]
    label_of = {g: i for i, g in enumerate(sorted({groups[c] for c in cids}, key=sorted))}
    labels = [label_of[groups[c]] for c in cids]
    views = {f"{emb['kind']} (the run's network)": embedding.embed(emb, mats),
             "pca": embedding.embed({"kind": "pca", "dim": int(emb["dim"])}, mats)}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    for ax, (name, e) in zip(axes, views.items()):
        xy = project_2d(e)
        ax.scatter(xy[:, 0], xy[:, 1], c=labels, cmap="tab20", s=18)
        ratio = group_ratio(e.numpy(), labels)
        ax.set_title(f"{name}: within/between distance {ratio:.3f}", fontsize=9)
        print(f"embeddings {name}: {len(cids)} clients, {len(label_of)} label groups, within/between {ratio:.4f}")
    fig.tight_layout()
    fig.savefig(out / "pfedrlla_embeddings.png", dpi=120)
    plt.close(fig)


def policy_diagnostics(agent: dict, last: int = 300) -> dict:
    """What the agent's state carries and what its actor does with it, over the replay buffer's last ``last``
    states (each the ``K'`` embeddings then the client's own, ``learner.choose_actions``):

    * ``spread``: mean over states of the embeddings' distance to their mean / the mean's norm (0: the state
      cannot tell the clients apart);
    * ``cos_mean`` / ``cos_min``: cosine of the client's embedding to each previous participant's (Eq. 2's input);
    * ``target_max_dev``: the largest distance of Eq. 2's ``V`` from uniform (1 / (K' + 1)) over states and slots;
    * ``saturated``: share of the actor's ``tanh`` outputs beyond 0.99 in absolute value (there its gradient
      vanishes);
    * ``weight_std``: the largest standard deviation over states of a slot's weight (0: one action for every
      state);
    * ``weight_mean``: the actor's mean weight per slot (the last slot is the client's own head).
    """
    from fedblend.algorithms.parts.nets import mlp
    from fedblend.algorithms.pfedrlla.rewards import similarity_target

    obs = agent["buffer"]["obs"][-last:].double()
    if obs.shape[0] == 0:
        return {}
    slots = int(agent["act_dim"])
    e = obs.reshape(obs.shape[0], slots, -1)
    mean = e.mean(1, keepdim=True)
    cos = torch.nn.functional.cosine_similarity(e[:, :-1], e[:, -1:], dim=2)
    targets = torch.stack([similarity_target(x[:-1], x[-1]) for x in e]).double()
    actor = {k: v.double() for k, v in agent["actor"].items()}
    with torch.no_grad():
        squashed = torch.tanh(mlp(actor, obs))
        weights = torch.softmax(squashed, dim=-1)
    return {"states": int(obs.shape[0]),
            "spread": float(((e - mean).norm(dim=2) / mean.norm(dim=2)).mean()),
            "cos_mean": float(cos.mean()), "cos_min": float(cos.min()),
            "target_max_dev": float((targets - 1.0 / slots).abs().max()),
            "saturated": float((squashed.abs() > 0.99).double().mean()),
            "weight_std": float(weights.std(0).max()) if obs.shape[0] > 1 else 0.0,
            "weight_mean": [float(x) for x in weights.mean(0)]}


def critic_slot_gradient(agent: dict, obs: torch.Tensor) -> list[float]:
    """Mean over ``obs`` of ``dQ(s, a) / da`` at the actor's action ``a = mu(s)``, centred over the slots per state:
    the deterministic policy gradient's push on each slot's weight (softmax ignores a shift common to all slots,
    so only the centred part moves the weights). Positive: the critic asks for more weight on that slot."""
    from fedblend.algorithms.pfedrlla import ddpg

    critic = {k: v.double() for k, v in agent["critic"].items()}
    actor = {k: v.double() for k, v in agent["actor"].items()}
    obs = obs.double()
    with torch.no_grad():
        act = ddpg.policy(actor, obs)
    act.requires_grad_(True)
    (g,) = torch.autograd.grad(ddpg.q_value(critic, obs, act).sum(), act)
    return [float(x) for x in (g - g.mean(1, keepdim=True)).mean(0)]


def initial_agent(agent: dict, seed: int) -> dict:
    """The agent a run with ``seed`` draws before its first update (``learner.new_agent`` in round 0), of the
    checkpoint agent's shape. A pre-trained agent was drawn by its pre-training run, with that run's seed."""
    from types import SimpleNamespace

    from fedblend.algorithms.pfedrlla.learner import new_agent
    from fedblend.common.rng import SeedTree
    from fedblend.core.method import server_tree

    hidden = int(agent["actor"][next(iter(agent["actor"]))].shape[0])
    return new_agent(int(agent["obs_dim"]), int(agent["act_dim"]), server_tree(SeedTree(seed), 0),
                     SimpleNamespace(hidden=hidden))


def replay_updates(agent: dict, opts, seed: int, rounds: int, init_seed: int) -> dict:
    """Offline, the DDPG updates of a run without pre-training again (``learner.learn``'s schedule over
    ``rounds``), each on the replay buffer as it stood then (rows are stored in order, the same number per round),
    with the run's replay batches (its ``seed``), from the agent that ``init_seed`` draws. With the run's own seed
    (and its thread count) this is the checkpoint's agent bit for bit; another ``init_seed`` changes only the
    initial networks: the same experience, the same batches."""
    from fedblend.algorithms.pfedrlla import ddpg
    from fedblend.algorithms.pfedrlla.learner import agent_updates_due
    from fedblend.common.rng import SeedTree
    from fedblend.core.method import server_tree

    buf = agent["buffer"]
    n = int(buf["obs"].shape[0])
    if rounds < 1 or n % rounds or n >= opts.buffer:
        raise ValueError(f"{n} replay rows over {rounds} rounds: not a whole number per round, or the ring has "
                         "wrapped (the buffer no longer holds every round's rows)")
    per_round = n // rounds
    out = initial_agent(agent, init_seed)
    for t in range(1, rounds + 1):
        m = per_round * t
        out = {**out, "buffer": {"obs": buf["obs"][:m], "act": buf["act"][:m], "rew": buf["rew"][:m], "next": m}}
        for u in range(agent_updates_due(opts, t, False)):
            out, _ = ddpg.update(out, server_tree(SeedTree(seed), t - 1).torch("replay", u), opts)
    return out


def replay_report(run: Path, init_seeds: list[int]) -> None:
    """:func:`replay_updates` for each of ``init_seeds``: the final actor's mean weight per slot and its top three
    slots, beside the top three of that seed's initial critic; for the run's own seed, how far the replay is from
    the checkpoint's actor (0 on the run's machine and thread count)."""
    from fedblend.algorithms.registry import build_method
    from fedblend.config import load_config
    from fedblend.core.checkpoint import FILENAME, load_checkpoint

    ck = load_checkpoint(run / FILENAME)
    agent = ck["server"].get("agent")
    if not agent or ck["server"].get("pretrained"):
        print("replay: needs a run whose agent was not pre-trained (its experience began in this run)")
        return
    cfg = load_config(run / "config.toml")
    opts = build_method(cfg.method, cfg.options).opts
    obs = agent["buffer"]["obs"][-300:]
    for s in init_seeds:
        a = replay_updates(agent, opts, cfg.seed, int(ck["next_round"]), s)
        d = policy_diagnostics({**a, "buffer": agent["buffer"]})
        first = critic_slot_gradient(initial_agent(agent, s), obs)
        gap = max(float((a["actor"][k] - agent["actor"][k]).abs().max()) for k in agent["actor"])
        print(f"replay from seed {s}'s agent: actor top slots {top_slots(d['weight_mean'])} (initial critic "
              f"{top_slots(first)}), own head {d['weight_mean'][-1]:.3f}, tanh at the bounds {d['saturated']:.2f}"
              + (f", max |actor - checkpoint's| {gap:.1e}" if s == cfg.seed else "")
              + "; weights " + " ".join(f"{w:.3f}" for w in d["weight_mean"]))


def top_slots(values: list[float], k: int = 3) -> list[int]:
    return sorted(int(i) for i in np.argsort(values)[::-1][:k])


def policy_report(run: Path) -> None:
    from fedblend.core.checkpoint import FILENAME, load_checkpoint

    agent = load_checkpoint(run / FILENAME)["server"].get("agent")
    d = policy_diagnostics(agent) if agent else {}
    if not d:
        print("no agent or no replay buffer in the checkpoint")
        return
    print(f"state ({d['states']} last replay states): embeddings' spread / common part {d['spread']:.4f}; cosine of "
          f"a client's embedding to the previous participants' {d['cos_mean']:.4f} (min {d['cos_min']:.4f}); "
          f"Eq. 2's V at most {d['target_max_dev']:.4f} from uniform")
    print(f"actor: tanh outputs at the bounds (|x| > 0.99) {d['saturated']:.3f}; largest std of a weight over states "
          f"{d['weight_std']:.4f}; mean weight per slot (own last) " + " ".join(f"{w:.3f}" for w in d["weight_mean"]))
    from fedblend.config import load_config

    obs = agent["buffer"]["obs"][-d["states"]:]
    seed = load_config(run / "config.toml").seed
    now, first = critic_slot_gradient(agent, obs), critic_slot_gradient(initial_agent(agent, seed), obs)
    print("critic's centred dQ/da per slot at the actor's action, now: " + " ".join(f"{x:+.4f}" for x in now))
    print(f"the same from the critic seed {seed} draws before training: " + " ".join(f"{x:+.4f}" for x in first))
    print(f"top three slots: actor {top_slots(d['weight_mean'])}, critic now {top_slots(now)}, "
          f"critic at seed {seed}'s initialisation {top_slots(first)}")


def time_split(history: list[dict], out: Path) -> None:
    parts = ["server_embedding_seconds", "server_agent_seconds", "server_aggregation_seconds"]
    server = {p: np.mean([m.get(p, 0.0) for m in history]) for p in parts}
    clients = np.mean([m.get("client_seconds", 0.0) * len(m["selected"]) for m in history])
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.bar([p.split("_")[1] for p in parts] + ["clients (sum)"], list(server.values()) + [clients])
    ax.set_ylabel("seconds per round")
    fig.tight_layout()
    fig.savefig(out / "pfedrlla_time.png", dpi=120)
    plt.close(fig)
    total = sum(server.values())
    print("time per round: " + ", ".join(f"{p.split('_')[1]} {v:.3f}s" for p, v in server.items())
          + f"; clients' training (sum) {clients:.2f}s; server / clients = {total / clients:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run")
    ap.add_argument("--out")
    ap.add_argument("--data-dir")
    ap.add_argument("--replay-seeds", type=int, nargs="*", default=[],
                    help="replay the run's DDPG updates from the agents these seeds draw (replay_report)")
    args = ap.parse_args()
    run = Path(args.run)
    out = Path(args.out) if args.out else run
    out.mkdir(parents=True, exist_ok=True)
    history, groups = load_history(run), class_sets(run)
    reward_curve(history, out)
    head_heatmap(history, groups, out)
    time_split(history, out)
    policy_report(run)
    if args.replay_seeds:
        replay_report(run, args.replay_seeds)
    embeddings_plot(run, groups, out, args.data_dir)


if __name__ == "__main__":
    main()
