"""Write the T4 configs (pFedRLLA paper protocol on MNIST / Fashion-MNIST) (configs/t4/ and the core rows in configs/benchmarks/).

    python bookkeeping/make_t4_configs.py          # (re)writes configs/t4/t4-*.toml and the core rows

The core rows (``CORE``: FMNIST pathological s = 2, FedAvg and pFedRLLA) go to configs/benchmarks/, whose every
config has a 3-round golden (tests/golden/benchmarks, ``bookkeeping/golden.py record``); the rest of the grid goes to
configs/t4/ (the pre-trained rows need an agent file first, see below, so they cannot have a golden).

Protocol (shared/benchmarks.md T4, paper Sec. 4.1, notes "pFedRLLA"): 100 clients, 10% join (fixed), per-client
65/15/20 train/val/test, 4-layer CNN, SGD lr 0.01 momentum 0.5 batch 64, 5 local epochs, 500 rounds (the paper;
pass --set rounds=N for a smaller budget and state it). Pathological = PFLlib "pat" (s classes per client, the
authors' code base); Dirichlet = PFLlib "dir". BP / AP scores and rounds to a target accuracy are recorded.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "configs"
CORE = {"t4-fmnist-pat2-fedavg", "t4-fmnist-pat2-pfedrlla"}
DATASETS = {"fmnist": 0.85, "mnist": 0.95}  # target accuracy for rounds_to_target (our choice, see docs)
PARTITIONS = {
    "pat2": {"kind": "pathological", "classes_per_client": 2},
    "pat5": {"kind": "pathological", "classes_per_client": 5},
    "dir0.1": {"kind": "dirichlet", "alpha": 0.1},
    "dir1.0": {"kind": "dirichlet", "alpha": 1.0},
}
METHODS = {
    "local": ("local", {}),
    "fedavg": ("fedavg", {}),
    "fedavg-ft": ("fedavg-ft", {"ft_epochs": 5}),  # App. B.2: 5 epochs of fine-tuning
    "fedala": ("fedala", {"eta": 1.0, "s": 80.0, "p": 4}),  # App. B.2: all layers, 80% of the data, lr 1
    "pfedrlla": ("pfedrlla", {}),
}
# MNIST* (App. B.1): one domain per client, the share of clients per domain at test and pre-training (App. D (d))
MNIST_STAR_TEST = {"kind": "domains", "domain_shares": [0.4, 0.4, 0.2]}
MNIST_STAR_PRETRAIN = {"kind": "domains", "domain_shares": [0.3, 0.3, 0.4]}
# ablations on FMNIST pat2 (Table 2 / 7, Table 5, Fig. 6)
ABLATIONS = {
    "pfedrlla-none": {"body": "mean", "head_weights": "mean"},
    "pfedrlla-body": {"body": "size", "head_weights": "mean"},
    "pfedrlla-head": {"body": "mean", "head_weights": "agent"},
    "pfedrlla-drl": {"agent_scope": "all"},
    "pfedrlla-b1zero": {"beta": [0.0, 1.0, 2.0]},
    "pfedrlla-b2zero": {"beta": [1.0, 0.0, 2.0]},
    "pfedrlla-b3zero": {"beta": [1.0, 1.0, 0.0]},
    "pfedrlla-pca": {"embedding": "pca"},
    "pfedrlla-flat": {"embedding": "flat"},
}


def fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return repr(v)


def config(name: str, method: str, dataset: str, part: dict, options: dict, target: float, comment: str,
           clients: int = 100, join: float = 0.1) -> str:
    lines = [f"# {comment}", f'name = "{name}"', f'method = "{method}"', f'dataset = "{dataset}"', 'model = "cnn4"',
             "rounds = 500", "seed = 0", "checkpoint_every = 10", "", "[partition]"]
    lines += [f"{k} = {fmt(v)}" for k, v in {**part, "rule": "pflib", "num_clients": clients,
                                             "split": "train_val_test"}.items()]
    lines += ["", "[train]", "lr = 0.01", "momentum = 0.5", "batch_size = 64", "epochs = 5", "",
              "[sampling]", 'scheme = "fixed"', f"join_ratio = {join}", "",
              "[eval]", "every = 1", 'report = "best"', "before_after = true", f"target = {target}"]
    if options:
        lines += ["", "[options]"] + [f"{k} = {fmt(v)}" for k, v in options.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    made = []
    head = "T4 of shared/benchmarks.md (pFedRLLA protocol): see bookkeeping/make_t4_configs.py"
    for ds, target in DATASETS.items():
        for pname, part in PARTITIONS.items():
            for mname, (method, opts) in METHODS.items():
                name = f"t4-{ds}-{pname}-{mname}"
                made.append((name, config(name, method, ds, part, opts, target, head)))
            # with pre-training: the agent from the s = 4 scenario (App. D), made by `fedblend pretrain`
            name = f"t4-{ds}-{pname}-pfedrlla-pretrained"
            made.append((name, config(name, "pfedrlla", ds, part, {"agent": f"agents/t4-{ds}-pat4.pt"}, target,
                                      head + "; agent file from: fedblend pretrain configs/t4/"
                                      f"t4-{ds}-pat4-pretrain.toml --out agents/t4-{ds}-pat4.pt")))
        name = f"t4-{ds}-pat4-pretrain"
        made.append((name, config(name, "pfedrlla", ds, {"kind": "pathological", "classes_per_client": 4}, {},
                                  target, "pre-training scenario (App. D: s = 4); run with `fedblend pretrain`")))
    for aname, opts in ABLATIONS.items():
        name = f"t4-fmnist-pat2-{aname}"
        made.append((name, config(name, "pfedrlla", "fmnist", PARTITIONS["pat2"], opts, DATASETS["fmnist"],
                                  head + "; ablation")))
    star = head + "; MNIST* = MNIST / USPS / mnist-texture (a stand-in for MNIST-M), one domain per client"
    for mname in ("fedavg", "fedavg-ft", "fedala", "pfedrlla"):  # MNIST* (App. B.1; stand-in for MNIST-M)
        method, opts = METHODS[mname]
        name = f"t4-mnist_star-domains-{mname}"
        made.append((name, config(name, method, "mnist_star", MNIST_STAR_TEST, opts, 0.9, star)))
    # App. D (d): MNIST*'s agent is pre-trained with 30 / 30 / 40 % of the clients on MNIST / USPS / MNIST-M and
    # tested with 40 / 40 / 20 %
    name = "t4-mnist_star-domains-pretrain"
    made.append((name, config(name, "pfedrlla", "mnist_star", MNIST_STAR_PRETRAIN, {}, 0.9,
                              star + "; pre-training scenario (App. D: 30 / 30 / 40 % of the clients); run with "
                              "`fedblend pretrain`")))
    name = "t4-mnist_star-domains-pfedrlla-pretrained"
    made.append((name, config(name, "pfedrlla", "mnist_star", MNIST_STAR_TEST, {"agent": "agents/t4-mnist_star.pt"},
                              0.9, star + "; agent file from: fedblend pretrain configs/t4/"
                              "t4-mnist_star-domains-pretrain.toml --out agents/t4-mnist_star.pt")))
    name = "t4-fmnist-nine-clients-pfedrlla"  # App. F.3 / Fig. 3: nine clients, full participation
    made.append((name, config(name, "pfedrlla", "fmnist", {"kind": "pathological", "classes_per_client": 2}, {},
                              DATASETS["fmnist"], "App. F.3 / Fig. 3: nine clients, full participation; "
                              "scripts/pfedrlla_plots.py draws the head-weight heatmap", clients=9, join=1.0)))
    (ROOT / "t4").mkdir(exist_ok=True)
    for name, text in made:
        (ROOT / ("benchmarks" if name in CORE else "t4") / f"{name}.toml").write_text(text)
    print(f"wrote {len(made)} configs: {sorted(CORE)} to {ROOT / 'benchmarks'}, the rest to {ROOT / 't4'}")


if __name__ == "__main__":
    main()
