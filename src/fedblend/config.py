"""Run configuration: a TOML file (or flags) validated up front into typed dataclasses.

Layout (every table optional; defaults shown in ``docs/config.md``)::

    method = "fedavg"          # a registered method, optionally with transforms: "fedprox+ala"
    dataset = "fmnist"         # mnist, fmnist, cifar10, cifar100, ag_news, usps, synthetic
    model = "lenet5"           # cnn4, lenet5, cnn5, mlp, fasttext
    rounds = 50
    seed = 0
    checkpoint_every = 10      # rounds between checkpoints (0 = never)
    device = "cpu"             # "cpu", "cuda" or "auto" (cuda when available)
    backend = "sequential"     # how client halves run: "sequential", "processes" (worker processes) or "vmap"
    workers = 2                # worker processes of the "processes" backend
    [partition] ...            # fedblend.data.federated.PartitionSpec
    [train] ...                # fedblend.core.training.TrainConfig
    [sampling] ...             # fedblend.core.sampling.SamplingConfig
    [eval] ...                 # fedblend.core.evaluation.EvalProtocol
    [options] ...              # the method's options (e.g. mu for fedprox)
    [ala] ...                  # a transform's options, one table per transform named in ``method``

``--set key=value`` overrides any field (``--set rounds=5 --set partition.alpha=0.5``); values are parsed as
TOML (numbers, booleans, quoted strings) and fall back to plain strings.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedblend.algorithms.registry import METHODS, TRANSFORMS, build_method, parse_method
from fedblend.common.options import ConfigError, from_table, to_table
from fedblend.core.evaluation import EvalProtocol
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig
from fedblend.data.federated import PartitionSpec
from fedblend.data.sources import DATASETS
from fedblend.models.zoo import MODELS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TABLES = {"partition": PartitionSpec, "train": TrainConfig, "sampling": SamplingConfig, "eval": EvalProtocol}
SCALARS = {"method": str, "dataset": str, "model": str, "rounds": int, "seed": int, "checkpoint_every": int,
           "name": str, "device": str, "backend": str, "workers": int}
DEVICES = ("cpu", "cuda", "auto")
BACKEND_NAMES = ("sequential", "processes", "vmap")


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
    partition: PartitionSpec = field(default_factory=PartitionSpec)
    train: TrainConfig = field(default_factory=TrainConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval: EvalProtocol = field(default_factory=EvalProtocol)
    options: dict = field(default_factory=dict)
    transforms: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.name or f"{self.dataset}-{self.partition.kind}-{self.method}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in SCALARS}
        for k in TABLES:
            out[k] = {kk: vv for kk, vv in to_table(getattr(self, k)).items() if vv is not None}
        out["options"] = dict(self.options)
        for t, tbl in self.transforms.items():
            out[t] = dict(tbl)
        return out

    def build_method(self):
        return build_method(self.method, self.options, self.transforms)

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


def config_from_dict(raw: dict[str, Any]) -> RunConfig:
    """Validate a raw dict (from TOML and ``--set``) into a :class:`RunConfig`."""
    raw = dict(raw)
    kwargs: dict[str, Any] = {}
    for k, tp in SCALARS.items():
        if k in raw:
            v = raw.pop(k)
            if tp is int and (isinstance(v, bool) or not isinstance(v, int)):
                raise ConfigError(f"{k} must be an integer, got {v!r}")
            if tp is str and not isinstance(v, str):
                raise ConfigError(f"{k} must be a string, got {v!r}")
            kwargs[k] = v
    method = kwargs.get("method", "fedavg")
    try:
        base, parts = parse_method(method)
    except ValueError as exc:
        raise ConfigError(f"method: {exc}") from exc
    if kwargs.get("dataset", "fmnist") not in list(DATASETS) + ["synthetic"]:
        raise ConfigError(f"dataset must be one of {sorted(DATASETS) + ['synthetic']}, got {kwargs['dataset']!r}")
    if kwargs.get("model", "lenet5") not in MODELS:
        raise ConfigError(f"model must be one of {sorted(MODELS)}, got {kwargs['model']!r}")
    if kwargs.get("device", "cpu") not in DEVICES:
        raise ConfigError(f"device must be one of {list(DEVICES)}, got {kwargs['device']!r}")
    if kwargs.get("backend", "sequential") not in BACKEND_NAMES:
        raise ConfigError(f"backend must be one of {list(BACKEND_NAMES)}, got {kwargs['backend']!r}")
    if kwargs.get("workers", 2) < 1:
        raise ConfigError(f"workers must be >= 1, got {kwargs['workers']}")
    if kwargs.get("rounds", 1) < 1:
        raise ConfigError(f"rounds must be >= 1, got {kwargs['rounds']}")
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
    return RunConfig(**kwargs)


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            raw = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: invalid TOML ({exc})") from exc
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
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"{k} = {fmt(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {fmt(vv)}" for kk, vv in v.items() if vv is not None]
    return "\n".join(lines) + "\n"


def fields_of(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
