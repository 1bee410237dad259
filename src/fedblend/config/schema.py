"""The run config's fields: the top-level scalars with their choices and ranges, the tables (``[partition]``,
``[train]``, ``[sampling]``, ``[eval]``, ``[log]``), the runtime-only fields, and :class:`RunConfig` with its
resolved form (every default filled in, the method's and transforms' tables included)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fedblend.algorithms.registry import METHODS, TRANSFORMS, build_method, parse_method
from fedblend.common.files import sha256_tree
from fedblend.common.options import ConfigError, file_fields, from_table, to_table
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig
from fedblend.data.federated import PartitionSpec
from fedblend.data.sources import DATASETS, SYNTHETIC
from fedblend.models.zoo import MODELS


@dataclass
class LogConfig:
    """Where a run's metrics go besides its results files (the ``[log]`` table). Runtime only: it changes no
    result, so it is left out of the config hash and may differ on ``--resume``."""

    CHOICES: ClassVar[dict] = {"wandb_mode": ("offline", "online"), "on_error": ("stop", "warn")}

    #: write every metrics row to ``OUT/tensorboard/`` (TensorBoard event files, one scalar per ``metrics.csv`` column,
    #: step = round) as it happens; needs ``pip install 'fedblend[tensorboard]'``. ``fedblend export tensorboard
    #: RUN_DIR`` does the same for a finished run
    tensorboard: bool = False
    #: write ``OUT/accuracy.png`` (personalized test accuracy per round with the clients' 10th-90th percentile band and
    #: the worst client, and the global model's, titled by method, setting and seed) at the end of the run; skipped with
    #: a warning without matplotlib (``pip install 'fedblend[plot]'``)
    plot: bool = True
    #: log every metrics row to MLflow as it happens (one MLflow run per results directory, continued on ``--resume``;
    #: the resolved config as parameters); needs ``pip install 'fedblend[mlflow]'``. ``fedblend export mlflow RUN_DIR``
    #: does the same for a finished run
    mlflow: bool = False
    #: MLflow tracking URI; empty = a local file store in ``OUT/mlruns`` (no server; read it back as docs/workflow.md
    #: says: MLflow 3 needs ``MLFLOW_ALLOW_FILE_STORE=true``, its UI the full ``mlflow`` package); or e.g.
    #: ``sqlite:///mlflow.db``, a server's URL (checked before round 1: a server that does not answer in 10 s stops the
    #: run in one line)
    mlflow_uri: str = ""
    #: MLflow experiment the run is logged under
    mlflow_experiment: str = "fedblend"
    #: log every metrics row to Weights & Biases as it happens, with the resolved config; needs ``pip install
    #: 'fedblend[wandb]'``. ``fedblend export wandb RUN_DIR`` does the same for a finished run
    wandb: bool = False
    #: ``offline``: the run's files in ``OUT/wandb`` (``wandb sync OUT/wandb/offline-run-*`` uploads them later);
    #: ``online``: logged live (needs ``wandb login``)
    wandb_mode: str = "offline"
    #: W&B project the run is logged under
    wandb_project: str = "fedblend"
    #: a tracker that fails (its store unusable, its server unreachable, ``.mlflow_run`` damaged, a write failing
    #: mid-run): ``stop`` ends the run in one line naming the tracker, its store and the fix (exit 1); ``warn`` warns
    #: once and the run goes on without that tracker
    on_error: str = "stop"


TABLES = {"partition": PartitionSpec, "train": TrainConfig, "sampling": SamplingConfig, "eval": EvalProtocol,
          "log": LogConfig}
SCALARS = {"method": str, "dataset": str, "model": str, "rounds": int, "seed": int, "checkpoint_every": int,
           "name": str, "device": str, "backend": str, "workers": int, "on_nonfinite": str, "store": str,
           "on_divergence": str, "divergence_factor": float, "init": str}
DEVICES = ("cpu", "cuda", "auto")
BACKEND_NAMES = ("sequential", "processes", "vmap", "flower-sim")
NONFINITE_POLICIES = ("stop", "skip")
DIVERGENCE_POLICIES = ("stop", "warn")
STORES = ("memory", "disk")
SCALAR_CHOICES = {"dataset": tuple(DATASETS) + tuple(SYNTHETIC), "model": tuple(MODELS), "device": DEVICES,
                  "backend": BACKEND_NAMES, "on_nonfinite": NONFINITE_POLICIES, "store": STORES,
                  "on_divergence": DIVERGENCE_POLICIES}
SCALAR_RANGES = {"rounds": "[1, 1000000]", "seed": "[0, 4294967295]", "checkpoint_every": "[0, 1000000]",
                 "workers": "[1, 1024]", "divergence_factor": "> 1"}
# Fields that change how a run executes but not its results: they may differ on --resume and are left out of
# the config hash. ``rounds`` may grow on --resume (it is in the hash: a longer run is another result). The
# divergence guard changes no number of a round either, only whether a diverged run stops or is flagged.
RUNTIME_ONLY = ("backend", "workers", "store", "log", "on_divergence", "divergence_factor")
#: the options that chose the evaluated model before ``[eval] model``: method or transform -> (field of its table,
#: that field's default). A config that sets one loads with a warning, the value read as ``eval.model`` (a default
#: value chooses nothing), so the ``config.toml`` of earlier runs still loads, resumes and compares
#: (:func:`migrate_eval`).
LEGACY_EVAL = {"apfl": ("eval_global", "received"), "dbe": ("eval", "received"), "fedphp": ("eval", "hpm"),
               "pfedhn": ("eval", "received"), "pfedla": ("eval", "trained"), "fedproto": ("eval", "proto"),
               "fedgh": ("eval", "header"), "fedala": ("eval", "ala"), "+ala": ("eval", "ala")}
# [partition] fields that apply to some splits only: setting one for another split is an error.
SPLIT_ONLY = {"train_fraction": ("merge", "train_val_test"), "val_fraction": ("train_val_test",),
              "test_per_client": ("official",), "min_test_samples": ("official",)}


@dataclass
class RunConfig:
    """A run's whole configuration, one field per top-level key and one dataclass per table of the TOML file
    (``docs/config.md``); :func:`fedblend.config.load_config` reads and checks one."""

    #: registered method, optionally ``+transform`` (``fedblend methods`` lists them)
    method: str = "fedavg"
    #: ``mnist``, ``fmnist``, ``cifar10``, ``cifar100``, ``ag_news``, ``usps``, ``mnist_star``, ``synthetic``
    #: (``synthetic-64k`` and ``synthetic-1m``: larger synthetic sets for the speed proxy and the cross-device scale
    #: configs; ``mnist_star``: pFedRLLA's MNIST* domain mix, 3x28x28: MNIST, USPS resized to 28x28, and
    #: ``mnist-texture``, MNIST digits over random colour textures, a stand-in for MNIST-M, which is not available;
    #: ``usps`` and ``mnist_star`` read ``usps.h5`` with ``h5py``: ``pip install 'fedblend[usps]'``, else a run stops in
    #: one line before it writes anything)
    dataset: str = "fmnist"
    #: ``cnn4``, ``lenet5``, ``cnn5``, ``mlp``, ``fasttext``
    model: str = "lenet5"
    #: communication rounds
    rounds: int = 50
    #: the one seed every random stream derives from
    seed: int = 0
    #: rounds between checkpoints (0 = never)
    checkpoint_every: int = 10
    #: label used by ``fedblend report`` to group seeds (default dataset-partition-method)
    name: str = ""
    #: ``cpu``, ``cuda``, ``auto`` (cuda when available); ``--device`` overrides. Model and client data move once
    device: str = "cpu"
    #: how client halves run: ``sequential`` (this process), ``processes`` (worker processes, CPU only; bit-identical
    #: results at the same per-process thread count), ``vmap`` (same-signature training specs of a round's clients as one
    #: batched computation, for GPUs; equal to sequential within float tolerance, not bit for bit) or ``flower-sim``
    #: (Flower's Simulation Engine: ClientApps in ``workers`` Ray actors, or on the Ray cluster of ``RAY_ADDRESS``; CPU
    #: only; bit-identical to sequential; ``fedblend run`` only, cannot be resumed; extra ``simulation``,
    #: docs/deploy.md#4-simulation-on-flowers-simulation-engine-ray); ``--backend`` overrides
    backend: str = "sequential"
    #: worker processes of ``backend = "processes"``, Ray actors of a local ``flower-sim`` (client ``c`` runs in worker
    #: ``c % workers``; each worker gets ``threads / workers`` torch threads, at least 1); ``--workers`` overrides.
    #: Measured on 2 cores (docs/benchmarks.md): two one-thread workers run a T1 round 1.08x and a T3 round 1.02x faster
    #: than one two-thread process; each worker holds a copy of its clients' data and API scripts need a ``__main__``
    #: guard, so ``sequential`` with ``--threads`` = cores stays the default
    workers: int = 2
    #: a client update or a client's new state (what it keeps without uploading, e.g. Ditto's personalized model) with
    #: NaN / inf, checked before aggregation: ``stop`` the run (summary.json says ``"status": "diverged"``, and it and
    #: the error line say which client and round) or ``skip`` that client's update and state for the round (listed in
    #: ``nonfinite_clients`` of metrics.jsonl and ``nonfinite_skipped`` of summary.json); a round whose every update is
    #: skipped has diverged (``on_divergence``)
    on_nonfinite: str = "stop"
    #: where client states live between rounds: in ``memory``, or on ``disk`` under ``OUT/clients/`` (one file per client
    #: through the state codec; only the round's clients are in memory). A checkpoint of the disk store is a new snapshot
    #: directory ``OUT/clients.ckpt/round<N>-<id>/`` of hard links, named in ``checkpoint.pt`` with the sha256 of every
    #: file; ``checkpoint.pt`` is replaced atomically after the snapshot is complete and older snapshots are removed only
    #: then, so ``--resume`` works after a failure at any point (see docs/workflow.md#checkpoints-and-resume). Results
    #: are identical either way, so it may change on ``--resume``
    store: str = "memory"
    #: a run that diverges (NaN / inf in the server state, in a client's state or ``train_loss``, in a personalized or
    #: global model's evaluation loss; every update of a round skipped by ``on_nonfinite = "skip"``; or a ``train_loss``
    #: past the bound of ``divergence_factor``): ``stop`` it after that round, or ``warn`` once and go on. Either way the
    #: round's row in metrics.jsonl carries ``"diverged": reason``, summary.json says ``"status": "diverged"`` with
    #: ``divergence`` = {round, reason}, the command ends with one ``fedblend: error:`` line and exit 1: a diverged run
    #: is never a result. Runtime only (not in the hash; may change on ``--resume``)
    on_divergence: str = "stop"
    #: the finite loss explosion bound: a round whose ``train_loss`` exceeds ``divergence_factor x max(ln C, L1)`` has
    #: diverged (``C`` classes, ``L1`` the run's first recorded ``train_loss``; round 1 itself is held to
    #: ``divergence_factor x ln C``, 230 for 10 classes). At 100 no benchmark config comes near it (their losses only
    #: fall below round 1's); MNIST at ``train.lr = 1000`` (train loss about 1e10) is caught in round 1. Runtime only
    divergence_factor: float = 100.0
    #: initial model weights: a ``state_dict`` file (``torch.save(model.state_dict(), PATH)``, tensors only, a path
    #: relative to the working directory) loaded in place of the seeded draw, e.g. a pretrained model or a reference
    #: implementation's initial weights (docs/validation.md, FedBABU). Every parameter and buffer of the model must be in
    #: it with the model's shape, nothing else: otherwise a one-line error names the missing, unexpected or misshapen
    #: tensors. ``""``: drawn from the seed. Recorded in config.toml and the hash only when set (the file's path); the
    #: file's sha256 is recorded in the run identity (``summary.json`` ``run.inputs``, a ``# input`` line heading
    #: config.toml), as for ``partition.path`` and pFedRLLA's ``options.agent``
    init: str = ""
    partition: PartitionSpec = field(default_factory=PartitionSpec)
    train: TrainConfig = field(default_factory=TrainConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval: EvalProtocol = field(default_factory=EvalProtocol)
    log: LogConfig = field(default_factory=LogConfig)
    options: dict = field(default_factory=dict)
    transforms: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        """The run's label: ``name``, else ``dataset-partition kind-method``."""
        return self.name or f"{self.dataset}-{self.partition.kind}-{self.method}"

    def to_dict(self) -> dict[str, Any]:
        """The config as plain nested dicts: unset (None) table fields left out, the method's options as given
        (:meth:`resolved` fills in every default)."""
        out: dict[str, Any] = {k: getattr(self, k) for k in SCALARS}
        if not self.init:  # recorded only when set: configs (and hashes) of runs from the seeded draw stay as before
            del out["init"]
        for k in TABLES:
            out[k] = _plain({kk: vv for kk, vv in to_table(getattr(self, k)).items() if vv is not None})
        out["options"] = dict(self.options)
        for t, tbl in self.transforms.items():
            out[t] = dict(tbl)
        return out

    def resolved(self) -> dict[str, Any]:
        """The config with every default filled in, the method's ``options`` and each transform's table
        included: what ``config.toml``, ``summary.json`` and the checkpoint record, and what the hash covers."""
        out = self.to_dict()
        base, parts = parse_method(self.method)
        out["options"] = _plain(to_table(from_table(METHODS[base].options_cls, self.options, "options")))
        for p in parts:
            out[p] = _plain(to_table(from_table(TRANSFORMS[p].options_cls, self.transforms.get(p), p)))
        if out["eval"].get("model") == next(iter(self.build_method().eval_choices())):
            del out["eval"]["model"]  # the method's default: recorded as unset, so the config (and hash) is one
        if out["train"].get("shuffle") is True:
            del out["train"]["shuffle"]  # recorded only when off: configs written before it keep their hash
        return out

    def build_method(self):
        """The method this config names, with its options, transforms and ``[eval] model``."""
        return build_method(self.method, self.options, self.transforms, self.eval.model)

    def input_files(self) -> dict[str, str]:
        """The files the run reads besides the dataset, by config key (``init``, ``partition.path``, a method or
        transform option declared ``opt(..., file=True)`` such as pFedRLLA's ``options.agent``) -> the path as
        configured. The config (and its hash) records the paths; the run identity records their contents'
        sha256 (``fedblend.experiment.run_identity``)."""
        out = {"init": self.init, "partition.path": self.partition.path if self.partition.kind == "indices" else ""}
        base, parts = parse_method(self.method)
        resolved = self.resolved()
        for table, cls in [("options", METHODS[base].options_cls)] + [(p, TRANSFORMS[p].options_cls) for p in parts]:
            out.update({f"{table}.{name}": resolved[table][name] for name in file_fields(cls)})
        return {k: str(v) for k, v in out.items() if v}

    def input_digests(self) -> dict[str, dict[str, str]]:
        """``{config key: {"path", "sha256"}}`` of :meth:`input_files` (a folder: over its files,
        :func:`fedblend.common.files.sha256_tree`). A path that does not exist is left out: the part that reads
        it reports it, with its own message."""
        return {key: {"path": path, "sha256": sha256_tree(path)} for key, path in self.input_files().items()
                if Path(path).exists()}

    def resolved_device(self) -> str:
        """``device`` with ``"auto"`` resolved (cuda when available); ``"cuda"`` without a GPU is an error."""
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("device = 'cuda' but PyTorch sees no CUDA device; use 'cpu' or 'auto'")
        return self.device


def _plain(table: dict[str, Any]) -> dict[str, Any]:
    """A table as TOML / JSON can hold it: tuples as lists, unset (None) fields left out."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in table.items() if v is not None}


def fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
