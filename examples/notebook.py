# %% [markdown]
# # fedblend from a notebook: a config as a dict, a run, per-client accuracies
#
# Cells in the "percent" format (VS Code, Jupytext, Spyder open them as a notebook; `python examples/notebook.py`
# runs them top to bottom). On Fashion-MNIST (the archives in `FEDBLEND_DATA`), 10 clients with Dir(0.3)
# label skew, FedALA for 5 rounds: about a minute on 2 CPU cores. `FEDBLEND_EXAMPLE_QUICK=1` runs the same cells on
# tiny synthetic data in seconds (what `tests/test_api.py` does).

# %%
import os
from pathlib import Path

import fedblend

QUICK = os.environ.get("FEDBLEND_EXAMPLE_QUICK") == "1"
OUT = Path(os.environ.get("FEDBLEND_EXAMPLE_OUT", "runs/notebook"))

config = {
    "method": "fedala",  # any registered method, "fedprox+ala", or your own plug-in
    "dataset": "fmnist",
    "model": "lenet5",
    "rounds": 5,
    "seed": 0,
    "partition": {"kind": "dirichlet", "alpha": 0.3, "num_clients": 10, "split": "official"},
    "train": {"lr": 0.05, "batch_size": 32, "epochs": 1},
    "log": {"plot": True},
}
if QUICK:  # the same cells on tiny synthetic data (8x8 images, 4 classes)
    config.update(dataset="synthetic", model="mlp", rounds=4)
    config["partition"].update(num_clients=6, min_samples=5, split="merge")

# %% [markdown]
# The dict goes through the same validation as `fedblend run` (a typo such as `"lrr"` raises the error the
# command line prints). Progress bars appear in a notebook by default.

# %%
result = fedblend.run(config, out=OUT, force=True)
print(result)
print({k: result.summary[k] for k in ("best_accuracy", "final_accuracy", "final_acc_client_worst",
                                      "final_acc_client_p10", "final_acc_client_std")})

# %% [markdown]
# `result.history` is one dict per round (what `metrics.jsonl` holds); `result.per_client()` flattens each
# evaluation's per-client counts into rows (`round`, `client`, `correct`, `n`, `accuracy`).

# %%
import sys  # noqa: E402

import matplotlib  # noqa: E402

if "ipykernel" not in sys.modules:  # a script: write the figure, open no window
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from fedblend.results.names import method_name, setting_text  # noqa: E402

rows = result.per_client()
clients = sorted({r["client"] for r in rows})
fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
for c in clients:
    pts = [(r["round"], 100 * r["accuracy"]) for r in rows if r["client"] == c and r["accuracy"] is not None]
    left.plot(*zip(*pts), color="tab:blue", alpha=0.35, lw=1)
pooled = [(m["round"], 100 * m["acc"]) for m in result.evaluated]
left.plot(*zip(*pooled), color="black", lw=2, marker=".", label="pooled over clients")
left.set_xlabel("round")
left.set_ylabel("personalized test accuracy (%)")
left.set_title("each client (thin) and pooled (thick)", fontsize=10)
left.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
left.legend(fontsize=8)
left.grid(alpha=0.3)

final = result.client_accuracies()  # {client: accuracy} at the last evaluated round
order = sorted(final, key=final.get)
right.bar(range(len(order)), [100 * final[c] for c in order], color="tab:blue")
right.axhline(100 * result.summary["final_acc_client_p10"], color="tab:red", lw=1, label="10th percentile")
right.set_xticks(range(len(order)), [str(c) for c in order])
right.set_xlabel("client (sorted by accuracy)")
right.set_ylabel("test accuracy at the final round (%)")
right.set_title("final round, per client", fontsize=10)
right.legend(fontsize=8, loc="upper left")
right.grid(axis="y", alpha=0.3)
method = method_name(result.summary["method"])
fig.suptitle(f"{method}: {setting_text(result.summary['run']['config'])}, seed {result.summary['seed']}",
             fontsize=10)
fig.tight_layout()
fig.savefig(OUT / "per_client_accuracy.png", dpi=110)
print(f"wrote {OUT / 'per_client_accuracy.png'}")
