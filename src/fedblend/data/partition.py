"""Partitioners: pure, seeded functions from labels to per-client index arrays.

Each ``draw_*`` function makes ONE draw from a ``numpy.random.Generator``; :func:`partition` repeats draws
(from fresh child generators) until the size rules hold, as the reference code does, and fails with an error
naming the parameter to change when they cannot be met.

Rules (see ``shared/notes/reference-implementations.md``):

* ``iid``: a random permutation cut into equal parts.
* ``dirichlet`` / rule ``pflib`` (PFLlib, used by FedALA): for each class, proportions ~ Dir(alpha); a client
  already holding >= N/num_clients samples gets no share of later classes; redraw until every client has at
  least min(40, N/num_clients/2) samples.
* ``dirichlet`` / rule ``fedapa`` (FedAPA's code): a class x client matrix P ~ Dir(alpha) per class; client k
  gets int(P[c,k] * n_c) samples of class c; redraw until every client has > 128 train samples (and > 2 test
  samples on the official split).
* ``pathological`` / rule ``pflib``: each client gets ``classes_per_client`` classes; for each class the first
  ceil(num_clients / C * cpc) clients with quota left receive it, unbalanced counts drawn as in PFLlib.
* ``pathological`` / rule ``fedapa``: classes in fixed blocks (floor(num_clients * cpc / C) clients per class,
  first clients with quota left), shares ~ U(0.3, 0.7) normalised.
* ``shards`` (McMahan et al. 2017): sort by label, cut into num_clients * shards_per_client shards, deal them out.
* ``one_class`` (FedALP / Fraboni et al. 2021): client k holds ``samples_per_client`` samples of class
  floor(k * C / num_clients), so each class sits on num_clients / C clients.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedblend.common.errors import ConfigError, UserFileError

Parts = list[np.ndarray]


class PartitionError(ConfigError):
    """Partition parameters that cannot be satisfied, or a partition file that does not fit; the message names
    the parameter and the fix. Bad input, like any :class:`ConfigError` (exit 2 on the command line)."""


class PartitionFileError(PartitionError, UserFileError):
    """A partition file (a ``partition.json``, a PFLlib folder) that cannot be used as it is: names the file,
    what is wrong and the fix (exit 2, as bad input)."""


def check_indices(indices: object, pools: dict[str, int], shared_test: bool, where: str) -> dict[str, list[list[int]]]:
    """``indices`` (``{"train": [[...], ...], "test": [...], optionally "val": [...]}``, as read from a file) checked
    against the pools they point into (``pools``: part -> pool size; parts with the same size share a pool only
    when ``shared_test`` is False, i.e. merged splits): every index an integer (not a float, not a boolean) in
    ``[0, pool size)`` (negative ones would wrap around), none repeated within a client's part, none shared
    between clients or between the parts of one pool -- except test indices across clients when ``shared_test``
    (the official split's test pool, from which ``test_per_client`` draws each client independently). Every
    part lists the same number of clients. Returns ``indices``; :class:`PartitionFileError` names ``where``, the
    first bad entry and what is allowed."""
    fix = "use a partition written by fedblend (partition.json of a run or of `fedblend partition --out DIR`)"
    if not isinstance(indices, dict) or not all(isinstance(indices.get(k), list) for k in ("train", "test")):
        raise PartitionFileError(f"{where}: \"indices\" must be an object with lists \"train\" and \"test\" (one "
                                 f"list of sample indices per client); {fix}")
    unknown = sorted(set(indices) - {"train", "test", "val"})
    if unknown:
        raise PartitionFileError(f"{where}: unknown part {unknown[0]!r} in \"indices\" (allowed: train, test, val)")
    n = len(indices["train"])
    for part, lists in indices.items():
        if not isinstance(lists, list) or len(lists) != n:
            raise PartitionFileError(f"{where}: indices.{part} lists {len(lists) if isinstance(lists, list) else '?'} "
                                     f"clients, indices.train lists {n}; every part needs one list per client")
    owner: dict[tuple[str, int], tuple[str, int]] = {}  # (pool, index) -> (part, client) that holds it
    for part in [p for p in ("train", "val", "test") if p in indices]:
        size = pools[part]
        pool = "test" if shared_test and part == "test" else "pool"
        for k, lst in enumerate(indices[part]):
            at = f"{where}: indices.{part}[{k}]"
            if not isinstance(lst, list):
                raise PartitionFileError(f"{at} must be a list of sample indices, got {type(lst).__name__}")
            seen: set[int] = set()
            for j, i in enumerate(lst):
                if type(i) is not int:
                    raise PartitionFileError(f"{at}[{j}] = {i!r}: sample indices must be integers; {fix}")
                if not 0 <= i < size:
                    raise PartitionFileError(f"{at}[{j}] = {i}: out of range, the pool of this dataset and split has "
                                             f"{size} samples (indices 0..{size - 1}); is this partition of this "
                                             f"dataset and partition.split?")
                if i in seen:
                    raise PartitionFileError(f"{at}[{j}] = {i}: listed twice for the same client; {fix}")
                seen.add(i)
                if pool == "test":
                    continue
                prev = owner.setdefault((pool, i), (part, k))
                if prev != (part, k):
                    raise PartitionFileError(f"{at}[{j}] = {i}: sample {i} is also in indices.{prev[0]}[{prev[1]}]; "
                                             f"a sample belongs to one client and one part; {fix}")
    return indices  # type: ignore[return-value]


def _class_indices(labels: np.ndarray, rng: np.random.Generator, num_classes: int) -> list[np.ndarray]:
    return [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]


def draw_iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator, **_: object) -> Parts:
    return [np.sort(p) for p in np.array_split(rng.permutation(len(labels)), num_clients)]


def draw_dirichlet_pflib(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, alpha: float,
                         num_classes: int, **_: object) -> Parts:
    cap = len(labels) / num_clients
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for idx in _class_indices(labels, rng, num_classes):
        props = rng.dirichlet(np.full(num_clients, alpha))
        props = np.array([p * (len(part) < cap) for p, part in zip(props, parts)])
        props = props / props.sum()
        cuts = (np.cumsum(props) * len(idx)).astype(int)[:-1]
        for part, chunk in zip(parts, np.split(idx, cuts)):
            part.extend(chunk.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def assign_by_proportions(labels: np.ndarray, props: np.ndarray, rng: np.random.Generator) -> Parts:
    """Client k gets int(props[c, k] * n_c) samples of each class c, disjoint, in client order."""
    num_classes, num_clients = props.shape
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for c, idx in enumerate(_class_indices(labels, rng, num_classes)):
        start = 0
        for k in range(num_clients):
            n = int(props[c, k] * len(idx))
            parts[k].extend(idx[start : start + n].tolist())
            start += n
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def dirichlet_fedapa_props(num_clients: int, rng: np.random.Generator, *, alpha: float, num_classes: int,
                           **_: object) -> np.ndarray:
    return rng.dirichlet(np.full(num_clients, alpha), size=num_classes)


def pathological_fedapa_props(num_clients: int, rng: np.random.Generator, *, classes_per_client: int,
                              num_classes: int, **_: object) -> np.ndarray:
    quota = [classes_per_client] * num_clients
    per_class = int(math.floor(num_clients * classes_per_client / num_classes))
    props = np.zeros((num_classes, num_clients))
    for c in range(num_classes):
        chosen = [k for k in range(num_clients) if quota[k] > 0][:per_class]
        for k in chosen:
            quota[k] -= 1
        if chosen:
            shares = rng.uniform(0.3, 0.7, size=len(chosen))
            props[c, chosen] = shares / shares.sum()
    return props


def draw_pathological_pflib(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *,
                            classes_per_client: int, num_classes: int, balanced: bool = False,
                            least_samples: int = 40, **_: object) -> Parts:
    quota = [classes_per_client] * num_clients
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    per_class = int(math.ceil(num_clients / num_classes * classes_per_client))
    for idx in _class_indices(labels, rng, num_classes):
        chosen = [k for k in range(num_clients) if quota[k] > 0][:per_class]
        if not chosen:
            continue
        per = len(idx) / len(chosen)
        if balanced or len(chosen) == 1:
            counts = [int(per)] * (len(chosen) - 1)
        else:
            low = max(per / 10, least_samples / num_classes)
            counts = rng.integers(int(low), max(int(per), int(low) + 1), size=len(chosen) - 1).tolist()
        counts.append(len(idx) - sum(counts))
        start = 0
        for k, n in zip(chosen, counts):
            parts[k].extend(idx[start : start + n].tolist())
            start += n
            quota[k] -= 1
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def draw_shards(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, shards_per_client: int = 2,
                **_: object) -> Parts:
    order = np.lexsort((rng.random(len(labels)), labels))
    shards = np.array_split(order, num_clients * shards_per_client)
    deal = rng.permutation(len(shards)).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([shards[s] for s in row])) for row in deal]


def draw_one_class(labels: np.ndarray, num_clients: int, rng: np.random.Generator, *, num_classes: int,
                   samples_per_client: int = 500, **_: object) -> Parts:
    pools = _class_indices(labels, rng, num_classes)
    used = [0] * num_classes
    parts = []
    for k in range(num_clients):
        c = k * num_classes // num_clients
        if used[c] + samples_per_client > len(pools[c]):
            raise PartitionError(
                f"partition.samples_per_client={samples_per_client} is too large: class {c} has "
                f"{len(pools[c])} samples for {sum(1 for j in range(num_clients) if j * num_classes // num_clients == c)}"
                f" clients. Lower samples_per_client or num_clients."
            )
        parts.append(np.sort(pools[c][used[c] : used[c] + samples_per_client]))
        used[c] += samples_per_client
    return parts


def draw_domains(domains: np.ndarray, num_clients: int, rng: np.random.Generator,
                 shares: Sequence[float]) -> Parts:
    """Every client's data from one domain (pFedRLLA App. B.1, MNIST*): domain ``d`` gets ``shares[d]`` of the
    clients (largest-remainder rounding, in domain order), and its samples are shuffled and dealt evenly over them."""
    n_dom = int(domains.max()) + 1 if len(domains) else 0
    if len(shares) != n_dom or min(shares) < 0 or sum(shares) <= 0:
        raise PartitionError(f"partition.domain_shares needs {n_dom} non-negative shares (one per domain), "
                             f"got {list(shares)}")
    raw = np.asarray(shares, dtype=np.float64) / sum(shares) * num_clients
    counts = np.floor(raw).astype(int)
    for d in np.argsort(-(raw - counts), kind="stable")[: num_clients - counts.sum()]:
        counts[d] += 1
    parts: Parts = []
    for d, k in enumerate(counts):
        idx = rng.permutation(np.flatnonzero(domains == d))
        if k > len(idx):
            raise PartitionError(f"domain {d} has {len(idx)} samples for {k} clients")
        parts += [np.sort(p.astype(np.int64)) for p in np.array_split(idx, k)] if k else []
    return parts


KINDS = ("iid", "dirichlet", "pathological", "shards", "one_class", "domains")
RULES = ("pflib", "fedapa")


def partition(labels: np.ndarray, num_clients: int, kind: str, rng_for_attempt: Callable[[int], np.random.Generator],
              *, num_classes: int, rule: str = "pflib", alpha: float = 0.1, classes_per_client: int = 2,
              shards_per_client: int = 2, samples_per_client: int = 500, balanced: bool = False,
              min_samples: int | None = None, max_tries: int = 1000,
              test_labels: np.ndarray | None = None, min_test_samples: int = 0) -> tuple[Parts, Parts | None]:
    """Split ``labels`` over ``num_clients``; optionally split ``test_labels`` with the same class proportions.

    Returns ``(train_parts, test_parts)``; ``test_parts`` is None when ``test_labels`` is None. Draw ``a`` uses
    ``rng_for_attempt(a)``, so the result depends only on the seed. ``min_samples`` defaults to the rule's own
    (PFLlib dir: min(40, N/num_clients/2); FedAPA: 129), 1 otherwise.
    """
    n = len(labels)
    _check_request(n, num_clients, kind, rule, num_classes, alpha, classes_per_client, shards_per_client)
    if min_samples is None:
        min_samples = default_min_samples(kind, rule, n, num_clients)
    if min_samples * num_clients > n:
        raise PartitionError(
            f"partition.min_samples={min_samples} x {num_clients} clients exceeds the {n} samples available; "
            f"lower min_samples or num_clients")
    params = dict(alpha=alpha, classes_per_client=classes_per_client, num_classes=num_classes,
                  shards_per_client=shards_per_client, samples_per_client=samples_per_client,
                  balanced=balanced, least_samples=40)
    for attempt in range(max_tries):
        train_parts, test_parts = _draw(labels, test_labels, num_clients, kind, rule, rng_for_attempt(attempt), params)
        ok = min(len(p) for p in train_parts) >= min_samples
        if test_parts is not None:
            ok = ok and min(len(p) for p in test_parts) >= min_test_samples
        if ok:
            return train_parts, test_parts
    raise PartitionError(
        f"could not give every client >= {min_samples} training samples"
        + (f" and >= {min_test_samples} test samples" if test_labels is not None and min_test_samples else "")
        + f" in {max_tries} draws of the {kind!r} partition: raise partition.alpha, lower num_clients or "
        f"partition.min_samples, or raise partition.max_tries"
    )


def _check_request(n: int, num_clients: int, kind: str, rule: str, num_classes: int, alpha: float,
                   classes_per_client: int, shards_per_client: int) -> None:
    """A partition of ``n`` samples that cannot be drawn as asked is a :class:`PartitionError` naming the field."""
    if kind not in KINDS:
        raise PartitionError(f"partition.kind must be one of {list(KINDS)}, got {kind!r}")
    if kind == "domains":
        raise PartitionError("partition.kind = 'domains' needs a dataset made of several domains (mnist_star)")
    if rule not in RULES:
        raise PartitionError(f"partition.rule must be one of {list(RULES)}, got {rule!r}")
    if num_clients < 1 or num_clients > n:
        raise PartitionError(f"num_clients must be in [1, {n}] (the number of samples), got {num_clients}")
    if kind == "dirichlet" and not alpha > 0:
        raise PartitionError(f"partition.alpha must be > 0 (smaller = more heterogeneous, e.g. 0.1), got {alpha}")
    if kind == "pathological" and not 1 <= classes_per_client <= num_classes:
        raise PartitionError(
            f"partition.classes_per_client must be in [1, {num_classes}], got {classes_per_client}")
    if kind == "pathological" and rule == "fedapa" and num_clients * classes_per_client < num_classes:
        raise PartitionError(
            f"rule 'fedapa' needs num_clients * classes_per_client >= {num_classes} so every class has a client")
    if kind == "shards" and num_clients * shards_per_client > n:
        raise PartitionError(f"partition.shards_per_client={shards_per_client} gives more shards than samples")


def default_min_samples(kind: str, rule: str, n: int, num_clients: int) -> int:
    """The rule's own smallest client (PFLlib dir: min(40, N/num_clients/2); FedAPA: 129), 1 otherwise."""
    if kind == "dirichlet" and rule == "pflib":
        return int(min(40, n / num_clients / 2))
    if rule == "fedapa" and kind in ("dirichlet", "pathological"):
        return 129
    return 1


def _draw(labels: np.ndarray, test_labels: np.ndarray | None, num_clients: int, kind: str, rule: str,
          rng: np.random.Generator, params: dict) -> tuple[Parts, Parts | None]:
    """One draw of the partition (and of the test split with the same class proportions) from ``rng``."""
    test_parts = None
    if rule == "fedapa" and kind in ("dirichlet", "pathological"):
        make = dirichlet_fedapa_props if kind == "dirichlet" else pathological_fedapa_props
        props = make(num_clients, rng, **params)
        train_parts = assign_by_proportions(labels, props, rng)
        if test_labels is not None:
            test_parts = assign_by_proportions(test_labels, props, rng)
    else:
        draw = {"iid": draw_iid, "dirichlet": draw_dirichlet_pflib, "pathological": draw_pathological_pflib,
                "shards": draw_shards, "one_class": draw_one_class}[kind]
        train_parts = draw(labels, num_clients, rng, **params)
        if test_labels is not None:
            test_parts = split_like(train_parts, labels, test_labels, rng, params["num_classes"])
    return train_parts, test_parts


def class_proportions(parts: Parts, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Matrix (classes x clients): share of each class's samples that each client holds."""
    counts = counts_matrix(parts, labels, num_classes).T.astype(np.float64)
    totals = np.bincount(labels, minlength=num_classes).astype(np.float64)
    return counts / np.maximum(totals, 1)[:, None]


def split_like(train_parts: Parts, train_labels: np.ndarray, test_labels: np.ndarray, rng: np.random.Generator,
               num_classes: int, per_client: int | None = None) -> Parts:
    """Divide the official test split by the train partition's per-class proportions (FedAPA protocol).

    With ``per_client`` set, each client instead gets ``per_client`` test samples drawn (without replacement,
    independently per client) with its training class mix - FedALP's 100 test samples per client.
    """
    if per_client is None:
        return assign_by_proportions(test_labels, class_proportions(train_parts, train_labels, num_classes), rng)
    pools = [np.flatnonzero(test_labels == c) for c in range(num_classes)]
    out = []
    for part in train_parts:
        mix = np.bincount(train_labels[part], minlength=num_classes) / max(len(part), 1)
        counts = np.floor(mix * per_client).astype(int)
        counts[np.argmax(mix)] += per_client - counts.sum()
        chosen = [rng.choice(pools[c], size=min(n, len(pools[c])), replace=False) for c, n in enumerate(counts) if n]
        out.append(np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64))
    return out


def counts_matrix(parts: Parts, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-client class counts, shape (clients, classes)."""
    return np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts]) if parts else np.zeros((0, 0))


def format_counts(train: np.ndarray, test: np.ndarray | None = None) -> str:
    """A per-client class-count table as text."""
    num_classes = train.shape[1]
    head = "client | " + " ".join(f"{c:>5}" for c in range(num_classes)) + " | train" + (" |  test" if test is not None else "")
    lines = [head, "-" * len(head)]
    for k, row in enumerate(train):
        line = f"{k:>6} | " + " ".join(f"{v:>5}" for v in row) + f" | {row.sum():>5}"
        if test is not None:
            line += f" | {test[k].sum():>5}"
        lines.append(line)
    return "\n".join(lines)
