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

    tensorboard: bool = False  # every metrics row to OUT/tensorboard as it happens (pip install 'fedblend[tensorboard]')
    plot: bool = True  # OUT/accuracy.png (personalized and global accuracy per round) at the end (needs matplotlib)
    mlflow: bool = field(default=False, metadata={"help": "every metrics row to MLflow as it happens, one run per "
                                                          "results directory (pip install 'fedblend[mlflow]')"})
    mlflow_uri: str = field(default="", metadata={"help": "MLflow tracking URI; empty = a local file store in "
                                                          "OUT/mlruns (no server)"})
    mlflow_experiment: str = field(default="fedblend", metadata={"help": "MLflow experiment the run is logged under"})
    wandb: bool = field(default=False, metadata={"help": "every metrics row to Weights & Biases as it happens "
                                                         "(pip install 'fedblend[wandb]')"})
    wandb_mode: str = field(default="offline", metadata={"help": "W&B mode: offline (files in OUT/wandb, `wandb "
                                                                 "sync` uploads them later) or online"})
    wandb_project: str = field(default="fedblend", metadata={"help": "W&B project the run is logged under"})
    on_error: str = field(default="stop", metadata={"help": "a tracker that fails (store unusable, server "
                                                             "unreachable): stop the run in one line naming it, or "
                                                             "warn once and go on without it"})


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
    method: str = "fedavg"
    dataset: str = "fmnist"
    model: str = "lenet5"
    rounds: int = 50
    seed: int = 0
    checkpoint_every: int = 10
    name: str = ""
    device: str = "cpu"
    backend: str = "sequential"
    workers: int = 2
    on_nonfinite: str = "stop"
    store: str = "memory"
    on_divergence: str = "stop"
    divergence_factor: float = 100.0
    # initial model weights: a state_dict file (torch.save) loaded in place of the seeded draw; "" = the draw
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
        return self.name or f"{self.dataset}-{self.partition.kind}-{self.method}"

    def to_dict(self) -> dict[str, Any]:
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
        return out

    def build_method(self):
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
