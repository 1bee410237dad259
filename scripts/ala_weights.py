"""Diagnostics of ALA's learned weights for one finished (or checkpointed) run.

    python scripts/ala_weights.py RUN_DIR [--out RUN_DIR/ala_weights.png]

Reads ``RUN_DIR/checkpoint.pt`` (every client's current W, ``cstate["ala"]``) and ``RUN_DIR/metrics.jsonl``
(per round, averaged over the selected clients: ``ala_w_{mean,q10,q50,q90}.<layer>``, ``ala_seconds``,
``ala_epochs``) and draws one PNG:

* one row per ALA layer: on the left the histogram of W pooled over all clients at the checkpoint, on the
  right the median and the 10-90 % band of W (client means) across rounds, and each client's own median
  trajectory from the rounds' ``stats_per_client`` (each learning client's ``ala_w_q50.<layer>``; runs recorded
  before that field existed kept it in ``cstate["ala"]["history"]``, read from the checkpoint instead);
* bottom row: ALA's share of the round's client work (the ``ala_share`` metric; for runs recorded before it existed,
  ``ala_seconds * len(selected) / seconds``), and the number
  of weight-learning epochs per round.

Every round axis spans the run's rounds with whole-number ticks; a panel with nothing to draw yet (a run of one or
two rounds: ALA learns W from round 2 on) says so instead of staying blank.

It also prints the per-round time share. matplotlib is imported only here, so the library does not need it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from fedblend.core.checkpoint import load_checkpoint
from fedblend.results.runs import read_metrics


def load(run: Path) -> tuple[dict, list[dict]]:
    ck = load_checkpoint(run / "checkpoint.pt")
    metrics = read_metrics(run)
    return ck, metrics


def layer_of(name: str) -> str:
    return name.rsplit(".", 1)[0]


def client_medians(metrics: list[dict], clients: dict, layer: str) -> dict[int, list[tuple[int, float]]]:
    """Each client's median W of ``layer`` per round it learned W in: ``{client: [(round, median), ...]}``, from
    the metrics rows' ``stats_per_client`` (or, for runs recorded before it, the checkpoint's per-client
    ``history``)."""
    out: dict[int, list[tuple[int, float]]] = {}
    key = f"ala_w_q50.{layer}"
    for m in metrics:
        pc = m.get("stats_per_client") or {}
        for cid, v in zip(pc.get("clients", ()), pc.get(key, ())):
            if v is not None:
                out.setdefault(int(cid), []).append((m["round"], v))
    if not out:  # an older run: the per-round summary was kept in each client's state
        for cid, a in clients.items():
            hist = [(h["round"], h["w"][layer][2]) for h in a.get("history", []) if layer in h["w"]]
            if hist:
                out[int(cid)] = hist
    return out


def time_share(metrics: list[dict]) -> list[tuple[int, float | None]]:
    out = []
    for m in metrics:
        if m.get("ala_share") is not None:
            out.append((m["round"], m["ala_share"]))
            continue
        a = m.get("ala_seconds")
        out.append((m["round"], a * len(m["selected"]) / m["seconds"] if a is not None and m["seconds"] else None))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--out", help="PNG path (default RUN_DIR/ala_weights.png)")
    args = ap.parse_args()
    run = Path(args.run_dir)
    ck, metrics = load(run)
    clients = {cid: st.get("ala") for cid, st in ck["clients"].items() if st.get("ala")}
    weights = {cid: a["weights"] for cid, a in clients.items() if a.get("weights")}
    if not weights:
        raise SystemExit(f"{run}: no ALA weights in the checkpoint (is the method fedala or X+ala?)")
    layers = sorted({layer_of(n) for w in weights.values() for n in w},
                    key=lambda ly: min(i for i, n in enumerate(next(iter(weights.values()))) if layer_of(n) == ly))
    shares = time_share(metrics)
    print("round  ala_share  ala_epochs")
    for (rnd, share), m in zip(shares, metrics):
        print(f"{rnd:5d}  {'-' if share is None else f'{share:9.3f}'}  {m.get('ala_epochs', '-')}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    last = max([m["round"] for m in metrics if "round" in m] + [ck["next_round"]])

    def empty(ax, text: str) -> None:
        """A panel with nothing to draw says why instead of staying blank."""
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=9, color="0.35",
                wrap=True)

    fig, axes = plt.subplots(len(layers) + 1, 2, figsize=(10, 3.4 * (len(layers) + 1)), squeeze=False)
    for j, ly in enumerate(layers):
        vals = torch.cat([w[n].reshape(-1) for w in weights.values() for n in w if layer_of(n) == ly]).numpy()
        ax = axes[j][0]
        ax.hist(vals, bins=50, range=(0, 1), color="tab:blue")
        ax.set_yscale("log")
        ax.set_title(f"W of {ly} at round {ck['next_round']}\n({len(weights)} clients, {vals.size} values)", fontsize=10)
        ax.set_xlabel("weight (0 = keep local, 1 = take global)")
        ax.set_ylabel("count")
        ax = axes[j][1]
        rows = [m for m in metrics if f"ala_w_q50.{ly}" in m]
        if rows:
            r = [m["round"] for m in rows]
            ax.fill_between(r, [m[f"ala_w_q10.{ly}"] for m in rows], [m[f"ala_w_q90.{ly}"] for m in rows],
                            alpha=0.3, label="q10-q90 (mean over clients)")
            mk = "." if len(r) < 30 else None
            ax.plot(r, [m[f"ala_w_q50.{ly}"] for m in rows], marker=mk, label="median")
            ax.plot(r, [m[f"ala_w_mean.{ly}"] for m in rows], marker=mk, label="mean")
        drawn = bool(rows)
        for traj in client_medians(metrics, clients, ly).values():
            ax.plot([r for r, _ in traj], [v for _, v in traj], color="grey", lw=0.5, alpha=0.5)
            drawn = True
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(f"W of {ly} across rounds" + ("\n(grey: each client's median)" if drawn and not rows else ""),
                     fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel("weight")
        if rows:
            ax.legend(fontsize=8, loc="lower right")
        if not drawn:
            empty(ax, "no weights recorded across rounds yet\n(ALA learns W from round 2 on)")
    ax = axes[-1][0]
    pts = [(r, 100 * s) for r, s in shares if s is not None]
    if pts:
        ax.plot(*zip(*pts), marker="o", ms=3)
    else:
        empty(ax, "no ALA timings in metrics.jsonl")
    ax.set_title("ALA's share of the clients' training time", fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("% of client time")
    ax.set_ylim(bottom=0)
    ax = axes[-1][1]
    pts = [(m["round"], m["ala_epochs"]) for m in metrics if m.get("ala_epochs") is not None]
    if pts:
        ax.plot(*zip(*pts), marker="o", ms=3)
    else:
        empty(ax, "no weight learning yet\n(ALA learns W from round 2 on)")
    ax.set_title("weight-learning epochs per client (mean)", fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("epochs")
    ax.set_ylim(bottom=0)
    for row in axes:
        for ax in row:
            if ax.get_xlabel() == "round":  # every round panel over the same rounds, whole-number ticks
                ax.set_xlim(0.5, last + 0.5)
                ax.xaxis.set_major_locator(MaxNLocator(integer=True))
                ax.yaxis.set_major_locator(MaxNLocator(integer=True)) if ax.get_ylabel() == "epochs" else None
    fig.tight_layout()
    out = Path(args.out) if args.out else run / "ala_weights.png"
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
