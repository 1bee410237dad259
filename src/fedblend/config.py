"""Run configuration: a TOML file (or flags) validated up front into typed dataclasses.

Layout (every table optional; defaults shown in ``docs/config.md``)::

    method = "fedavg"          # a registered method, optionally with transforms: "fedprox+ala"
    dataset = "fmnist"         # mnist, fmnist, cifar10, cifar100, ag_news, usps, synthetic
    model = "lenet5"           # cnn4, lenet5, cnn5, mlp, fasttext
    rounds = 50
    seed = 0
    checkpoint_every = 10      # rounds between checkpoints (0 = never)
    device = "cpu"             # "cpu", "cuda" or "auto" (cuda when available)
    backend = "sequential"     # how client halves run: "sequential", "processes" (worker processes), "vmap" or
                               # "flower-sim" (Flower's Simulation Engine, Ray actors; `fedblend run` only)
    workers = 2                # worker processes of the "processes" backend, Ray actors of "flower-sim"
    on_nonfinite = "stop"      # a client update with NaN/inf: "stop" the run, or "skip" that client's update
    on_divergence = "stop"     # a diverged run (NaN/inf in a state or loss, a loss explosion): "stop" or "warn"
    divergence_factor = 100.0  # a train loss above this x max(ln classes, round 1's train loss) has diverged
    store = "memory"           # client states in "memory", or on "disk" (OUT/clients, one file per client)
    [partition] ...            # fedblend.data.federated.PartitionSpec
    [train] ...                # fedblend.core.training.TrainConfig
    [sampling] ...             # fedblend.core.sampling.SamplingConfig
    [eval] ...                 # fedblend.core.evaluation.EvalProtocol
    [options] ...              # the method's options (e.g. mu for fedprox)
    [ala] ...                  # a transform's options, one table per transform named in ``method``
    [log] ...                  # LogConfig: trackers and the end-of-run plot (runtime only: not in the hash)

``--set key=value`` overrides any field (``--set rounds=5 --set partition.alpha=0.5``); values are parsed as
TOML (numbers, booleans, quoted strings) and fall back to plain strings.

Every field is checked here, before any data is loaded or file written: its type, its choices, its range
(``RANGES`` of each table's dataclass, ``SCALAR_RANGES`` here) and the cross-field rules of
:func:`check_cross_fields`. :meth:`RunConfig.resolved` is the config with every default filled in (method and
transform tables included); :func:`config_hash` identifies it, and :func:`config_diff` lists what differs
between two resolved configs (``--resume`` refuses a differing one).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fedblend.algorithms.registry import METHODS, TRANSFORMS, build_method, parse_method
from fedblend.common.argtypes import overrides_arg, path_arg
from fedblend.common.files import sha256_tree
from fedblend.common.jsonio import dotted_keys
from fedblend.common.options import ConfigError, check_value, file_fields, from_table, to_table
from fedblend.common.plugins import PluginError
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig
from fedblend.data.federated import PartitionSpec
from fedblend.data.sources import DATASETS, INPUTS, SYNTHETIC, find_dataset
from fedblend.models.zoo import MODELS, build_model, find_model
from fedblend.rundir import check_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib



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
    (``docs/config.md``); :func:`load_config` reads and checks one."""

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


def parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p} is not a table")
        node[parts[-1]] = parse_value(text.strip())
    return raw


def migrate_eval(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``raw`` with the evaluation options of :data:`LEGACY_EVAL` (``[options] eval``, ``eval_global``, ``[ala]
    eval``) moved to ``[eval] model``, and the old spellings found (``["ala.eval = 'stored'"]``). A default value
    chooses nothing and is dropped; a ``ConfigError`` where two of them, or one and ``[eval] model``, differ."""
    method = raw.get("method", "fedavg")
    if not isinstance(method, str):
        return raw, []
    base, *parts = [s.strip() for s in method.split("+")]
    out, found, chosen = dict(raw), [], {}
    for table, legacy in [("options", LEGACY_EVAL.get(base))] + [(p, LEGACY_EVAL.get("+" + p)) for p in parts]:
        if legacy is None or not isinstance(out.get(table), dict) or legacy[0] not in out[table]:
            continue
        out[table] = dict(out[table])
        value = out[table].pop(legacy[0])
        found.append(f"{table}.{legacy[0]} = {value!r}")
        if value != legacy[1]:
            chosen[f"{table}.{legacy[0]}"] = value
    given = (out.get("eval") or {}).get("model") if isinstance(out.get("eval"), dict) else None
    if len(chosen) > 1 or (chosen and given is not None and given not in chosen.values()):
        both = ", ".join(f"{k} = {v!r}" for k, v in chosen.items())
        raise ConfigError(f"{both}{f' and eval.model = {given!r}' if given is not None else ''}: the evaluated model "
                          f"is one choice now, [eval] model; set it alone")
    if chosen:
        out["eval"] = {**(out.get("eval") or {}), "model": next(iter(chosen.values()))}
    return out, found


def with_new_defaults(resolved: dict[str, Any]) -> dict[str, Any]:
    """A recorded resolved config with the method's and transforms' option fields added since it was recorded
    filled in at their defaults. A new option's default keeps the behaviour runs had before it existed (the
    project's rule for adding one), so a run made before it resumes, and shares a report row, with runs that record
    it. Tables of a method or transform not registered here (a plug-in's) are left as they are."""
    out = dict(resolved)
    try:
        base, parts = parse_method(out.get("method", "fedavg"))
    except (ValueError, PluginError):
        return out
    for table, cls in [("options", METHODS.get(base))] + [(p, TRANSFORMS.get(p)) for p in parts]:
        given = out.get(table, {})
        if cls is None or not isinstance(given, dict):
            continue
        try:
            defaults = _plain(to_table(from_table(cls.options_cls, {}, table)))
        except (ConfigError, ValueError, TypeError):  # options without defaults for every field: nothing to add
            continue
        out[table] = {**defaults, **given}
    return out


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw dict (from TOML and ``--set``) into a :class:`RunConfig`."""
    raw, legacy = migrate_eval(dict(raw))
    if legacy:
        model = (raw.get("eval") or {}).get("model")
        warnings.warn(f"{', '.join(legacy)}: the evaluated model is [eval] model now (the method's options no longer "
                      f"choose it); read as {f'eval.model = {model!r}' if model else 'the default'}. Write "
                      f"{f'[eval] model = {model!r}' if model else 'nothing (the default)'} instead", FutureWarning,
                      stacklevel=2)
    kwargs: dict[str, Any] = {}
    for k, tp in SCALARS.items():
        if k in raw:
            choices = SCALAR_CHOICES.get(k)
            if k in ("dataset", "model"):  # listed sorted in the message
                choices = tuple(sorted(choices))
                if isinstance(raw[k], str) and raw[k] not in choices and _plugin_exists(k, raw[k]):
                    choices = None  # a plug-in's dataset or model (fedblend.common.plugins)
            try:
                kwargs[k] = check_value(raw.pop(k), tp, k, choices, SCALAR_RANGES.get(k))
            except ConfigError as exc:
                if k not in ("dataset", "model"):
                    raise
                raise ConfigError(f"{exc} (or a plug-in: an entry point of group fedblend.{k}s, or "
                                  f"'package.module:{'function' if k == 'dataset' else 'Class'}')") from None
    method = kwargs.get("method", "fedavg")
    try:
        base, parts = parse_method(method)
    except PluginError:
        raise
    except ValueError as exc:
        raise ConfigError(f"method: {exc}") from exc
    for name in [*TABLES, "options", *parts]:
        if name in raw and not isinstance(raw[name], dict):
            raise ConfigError(f"{name} must be a table (e.g. [{name}] in the file, or --set {name}.FIELD=VALUE), "
                              f"got {raw[name]!r}")
    given = {name: set(raw.get(name, {})) for name in TABLES}
    for name, cls in TABLES.items():
        kwargs[name] = from_table(cls, raw.pop(name, {}), name)
    kwargs["options"] = raw.pop("options", {})
    from_table(METHODS[base].options_cls, kwargs["options"], "options")
    kwargs["transforms"] = {}
    for p in parts:
        kwargs["transforms"][p] = raw.pop(p, {})
        from_table(TRANSFORMS[p].options_cls, kwargs["transforms"][p], p)
    if raw:
        key = sorted(raw)[0]
        allowed = sorted(list(SCALARS) + list(TABLES) + ["options"] + parts)
        hint = f" (a table for transform {key!r} needs it in method, e.g. 'fedavg+{key}')" if key in TRANSFORMS else ""
        raise ConfigError(f"unknown field {key!r}{hint}; allowed: {', '.join(allowed)}")
    if "name" in kwargs:
        check_name(kwargs["name"])
    if kwargs.get("init") and not Path(kwargs["init"]).is_file():
        raise ConfigError(f"init: {kwargs['init']} is not a file (a state_dict saved with torch.save; a path "
                          f"relative to the working directory)")
    cfg = RunConfig(**kwargs)
    try:
        cfg.build_method()  # composition rules (e.g. a transform that needs a global model)
    except ValueError as exc:
        raise ConfigError(f"method: {exc}") from exc
    check_cross_fields(cfg, given["partition"])
    return cfg


def check_config(cfg: RunConfig) -> RunConfig:
    """Check ``cfg`` as :func:`load_config` checks a file (types, choices, ranges, cross-field rules), whatever
    happened to it since (fields set through the Python API, tables replaced by hand-built dataclasses);
    returns the validated copy. ``run_experiment``, ``dry_run`` and ``bench`` call it."""
    if not isinstance(cfg, RunConfig):
        raise ConfigError(f"expected a RunConfig, got {type(cfg).__name__}")
    raw: dict[str, Any] = {k: getattr(cfg, k) for k in SCALARS}
    for name, cls in TABLES.items():
        table = getattr(cfg, name)
        if not isinstance(table, cls):
            raise ConfigError(f"{name} must be a {cls.__name__}, got {type(table).__name__}")
        raw[name] = to_table(table)
    if not isinstance(cfg.transforms, dict):
        raise ConfigError(f"transforms must be a dict of tables, got {cfg.transforms!r}")
    for name, table in (("options", cfg.options), *cfg.transforms.items()):
        if not isinstance(table, dict):
            raise ConfigError(f"{name} must be a table (a dict), got {table!r}")
        raw[name] = dict(table)
    return config_from_dict(raw)


def _plugin_exists(kind: str, name: str) -> bool:
    """Whether a plug-in provides dataset / model ``name`` (importing it; a broken plug-in raises its error)."""
    return (find_dataset if kind == "dataset" else find_model)(name) is not None


def check_cross_fields(cfg: RunConfig, partition_given: set[str] = frozenset()) -> None:
    """Rules between fields: the model fits the dataset, evaluation on validation data needs a split that has
    it, and split-specific ``[partition]`` options (``partition_given``: the ones set explicitly) match the
    split."""
    split = cfg.partition.split
    if "val" in (cfg.eval.split, cfg.eval.select) and split != "train_val_test":
        which = "eval.split" if cfg.eval.split == "val" else "eval.select"
        raise ConfigError(f"{which} = 'val' needs validation data, which only partition.split = "
                          f"'train_val_test' has; got partition.split = {split!r}")
    default = PartitionSpec()
    for name in sorted(partition_given & set(SPLIT_ONLY)):
        # the default value is accepted anywhere, so a resolved config.toml (every field written) loads again
        if split not in SPLIT_ONLY[name] and getattr(cfg.partition, name) != getattr(default, name):
            raise ConfigError(f"partition.{name} applies only to partition.split = "
                              f"{' or '.join(repr(s) for s in SPLIT_ONLY[name])}; got partition.split = {split!r}")
    if cfg.device == "cuda" and cfg.backend in ("processes", "flower-sim"):
        raise ConfigError(f"backend = {cfg.backend!r} runs on CPU only; got device = 'cuda' (use backend = "
                          "'sequential' or device = 'cpu')")


def check_model_fits(model: str, dataset: str) -> None:
    """The model accepts the dataset's samples (text vs image, image size), from :data:`INPUTS` alone: a
    model built for the dataset's shape runs one zero sample. Checked before a run (not by ``partition``,
    which builds no model)."""
    if dataset not in INPUTS:  # a plug-in dataset that does not declare its inputs: checked when it is loaded
        return
    kind, shape = INPUTS[dataset]
    wants = "text" if model == "fasttext" else "image"
    builtin = model in SCALAR_CHOICES["model"]  # a plug-in model says nothing about its input kind
    if kind != wants and builtin:
        raise ConfigError(f"model {model!r} needs {wants} data; dataset {dataset!r} is {kind} "
                          f"(choose {'fasttext' if kind == 'text' else 'an image model'})")
    if shape is None:
        return
    import torch

    c, side = shape
    info = {"in_channels": c, "image_size": side, "num_classes": 2, "input_shape": (c, side, side)}
    try:
        with torch.no_grad():
            build_model(model, info)(torch.zeros(1, c, side, side))
    except PluginError:
        raise
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"model {model!r} does not fit dataset {dataset!r} ({c}x{side}x{side} images): "
                          f"{str(exc).splitlines()[0]}") from exc


def config_hash(resolved: dict[str, Any]) -> str:
    """Short sha256 of a resolved config without the runtime-only fields (same results, same hash)."""
    core = {k: v for k, v in resolved.items() if k not in RUNTIME_ONLY}
    text = json.dumps(core, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_diff(old: dict[str, Any], new: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """``"field: old -> new"`` for every dotted field that differs between two resolved configs."""
    a, b = dotted_keys(old), dotted_keys(new)
    return [f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}" for k in sorted(set(a) | set(b))
            if k not in ignore and k.split(".")[0] not in ignore and a.get(k, _UNSET) != b.get(k, _UNSET)]


_UNSET = object()


def _plain(table: dict[str, Any]) -> dict[str, Any]:
    """A table as TOML / JSON can hold it: tuples as lists, unset (None) fields left out."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in table.items() if v is not None}


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """The validated :class:`RunConfig` of the TOML file ``path`` (None: the defaults) with ``overrides``, a list
    of ``--set``-style ``"key=value"`` strings, applied. A wrong kind of argument (a number or bytes for the
    path, one string for the overrides) is a ``TypeError`` naming it (:mod:`fedblend.common.argtypes`)."""
    path = path_arg(path, "load_config's path")
    overrides = overrides_arg(overrides, "load_config's overrides")
    raw: dict[str, Any] = {}
    if path is not None:
        p = path
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        if not p.is_file():
            raise ConfigError(f"config file {p} is not a file")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: invalid TOML ({exc})") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {p} cannot be read as UTF-8 text ({exc})") from exc
    return config_from_dict(apply_overrides(raw, overrides or []))


def dump_toml(data: dict[str, Any]) -> str:
    """Minimal TOML writer for resolved configs (scalars first, then one level of tables)."""

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table (partition.flwr_options)
            return "{" + ", ".join(f"{kk} = {fmt(vv)}" for kk, vv in v.items()) + "}"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"{k} = {fmt(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {fmt(vv)}" for kk, vv in v.items() if vv is not None]
    return "\n".join(lines) + "\n"


def fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


# ------------------------------------------------------------------------------------------------ docs
SCALAR_ALLOWED = {"method": "a registered method, optionally `+transform` (`fedblend methods`)",
                  "name": "string"}


def _fmt_default(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "`true`" if v else "`false`"
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, (list, tuple)):
        return "`[" + ", ".join(map(str, v)) + "]`"
    return f"`{v!r}`"


def _scalar_allowed(name: str) -> str:
    if name in SCALAR_ALLOWED:
        return SCALAR_ALLOWED[name]
    if name in SCALAR_CHOICES:
        return " / ".join(f"`{c}`" for c in SCALAR_CHOICES[name])
    return f"{SCALARS[name].__name__} {SCALAR_RANGES[name]}" if name in SCALAR_RANGES else SCALARS[name].__name__


def field_docs() -> dict[str, list[tuple[str, str, str, str]]]:
    """``{section heading: [(field, default, allowed, meaning), ...]}`` for every field a run config accepts, from
    the code (types, ``CHOICES``, ``RANGES``, and each field's documentation,
    :func:`fedblend.common.options.field_doc`): ``docs/config.md``'s tables are generated from these
    (``python bookkeeping/gen_docs.py``; ``tests/test_config_docs.py`` fails when they are stale), so the
    documented ranges cannot drift from the checked ones."""
    from fedblend.common.options import allowed_text, field_doc

    default = RunConfig()
    out = {"Top level": [(k, _fmt_default(getattr(default, k)), _scalar_allowed(k), field_doc(RunConfig, k))
                         for k in SCALARS]}

    def table(cls: type) -> list[tuple[str, str, str, str]]:
        return [(f.name, _fmt_default(f.default), allowed_text(cls, f.name), field_doc(cls, f.name))
                for f in dataclasses.fields(cls)]

    for name, cls in TABLES.items():
        out[f"`[{name}]`"] = table(cls)
    for name, mcls in sorted(METHODS.items()):
        if dataclasses.fields(mcls.options_cls):
            out[f"`[options]` of `{name}`"] = table(mcls.options_cls)
    for name, tcls in sorted(TRANSFORMS.items()):
        if dataclasses.fields(tcls.options_cls):
            out[f"`[{name}]` (transform `+{name}`)"] = table(tcls.options_cls)
    return out
