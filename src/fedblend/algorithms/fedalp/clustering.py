"""Client clustering for FedALP (Xie et al. 2022, Algorithm 2 line 1-2), in plain numpy.

* :func:`cosine_similarity` -- the pairwise similarity matrix ``rho`` of FedALP Eq. 3-4;
* :func:`similarity_to_distance` -- ``1 - rho`` ("cosine") or ``arccos(rho)`` ("angular", what the clustering
  code of Fraboni et al. 2021, FedALP's reference [4], feeds to Ward);
* :func:`ward_linkage` -- agglomerative clustering with Ward's criterion on a distance matrix, returning a
  linkage matrix in SciPy's layout ``[a, b, height, size]`` (Lance-Williams update; the numbers equal
  ``scipy.cluster.hierarchy.linkage(condensed, "ward")`` when there are no ties);
* :func:`cut` -- the flat clustering into ``M`` groups ("intersect P to determine M groups");
* :func:`adjusted_rand_index` -- agreement of two labelings (Hubert & Arabie 1985), for diagnostics;
* :func:`clustering_report` -- one FedALP clustering against the clients' dominant classes (for reports).

No SciPy: the package does not depend on it. The naive O(K^3) agglomeration is fast for the few hundred clients
FedALP clusters (K = 100: a few milliseconds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def cosine_similarity(updates: np.ndarray) -> np.ndarray:
    """``rho[i, j] = <u_i, u_j> / (||u_i|| ||u_j||)`` for the rows of ``updates`` (FedALP Eq. 4).

    A zero row (a client whose update is zero) has similarity 0 to every other client and 1 to itself.
    """
    u = np.asarray(updates, dtype=np.float64)
    norms = np.linalg.norm(u, axis=1)
    safe = np.where(norms > 0, norms, 1.0)
    unit = u / safe[:, None]
    rho = np.clip(unit @ unit.T, -1.0, 1.0)
    np.fill_diagonal(rho, 1.0)
    return rho


def similarity_to_distance(rho: np.ndarray, kind: str = "cosine") -> np.ndarray:
    """Distance matrix for Ward: ``1 - rho`` ("cosine") or ``arccos(rho)`` in radians ("angular")."""
    rho = np.clip(np.asarray(rho, dtype=np.float64), -1.0, 1.0)
    if kind == "cosine":
        d = 1.0 - rho
    elif kind == "angular":
        d = np.arccos(rho)
    else:
        raise ValueError(f"similarity must be 'cosine' or 'angular', got {kind!r}")
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, 0.0)
    return np.maximum(d, 0.0)


def rows_as_points_distance(matrix: np.ndarray) -> np.ndarray:
    """Euclidean distances between the rows of ``matrix``.

    This is what ``scipy.cluster.hierarchy.linkage(square_matrix, "ward")`` does when handed a square matrix
    (as the clustered-sampling code of Fraboni et al. does): it treats each row as an observation vector.
    """
    m = np.asarray(matrix, dtype=np.float64)
    sq = (m * m).sum(1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * m @ m.T, 0.0)
    d = np.sqrt(d2)
    np.fill_diagonal(d, 0.0)
    return 0.5 * (d + d.T)


def ward_linkage(dist: np.ndarray) -> np.ndarray:
    """Ward agglomerative clustering of ``K`` points given their ``K x K`` distance matrix.

    Repeatedly merges the two clusters at the smallest Ward distance (ties: the pair with the smallest
    indices, cluster ids as in SciPy: points ``0..K-1``, the cluster made at step ``s`` is ``K + s``) and
    updates distances with the Lance-Williams formula for Ward::

        d(k, i+j) = sqrt(((n_k + n_i) d(k,i)^2 + (n_k + n_j) d(k,j)^2 - n_k d(i,j)^2) / (n_i + n_j + n_k))

    Returns ``Z`` of shape ``(K-1, 4)``: merged ids ``a < b``, merge height, size of the new cluster.
    """
    d = np.array(dist, dtype=np.float64)
    k = d.shape[0]
    if d.shape != (k, k):
        raise ValueError(f"ward_linkage needs a square distance matrix, got shape {d.shape}")
    if k < 2:
        return np.zeros((0, 4))
    d = 0.5 * (d + d.T)
    np.fill_diagonal(d, np.inf)
    ids = list(range(k))  # cluster id sitting in each slot
    size = np.ones(k)
    alive = np.ones(k, dtype=bool)
    z = np.zeros((k - 1, 4))
    for step in range(k - 1):
        masked = np.where(alive[:, None] & alive[None, :], d, np.inf)
        flat = int(np.argmin(masked))
        i, j = divmod(flat, k)
        if i > j:
            i, j = j, i
        h = d[i, j]
        a, b = sorted((ids[i], ids[j]))
        ni, nj = size[i], size[j]
        z[step] = (a, b, h, ni + nj)
        # Lance-Williams update into slot i; slot j dies
        others = alive.copy()
        others[[i, j]] = False
        nk = size[others]
        new = np.sqrt(np.maximum(
            ((nk + ni) * d[i, others] ** 2 + (nk + nj) * d[j, others] ** 2 - nk * h ** 2) / (ni + nj + nk), 0.0))
        d[i, others] = new
        d[others, i] = new
        alive[j] = False
        d[j, :] = np.inf
        d[:, j] = np.inf
        size[i] = ni + nj
        ids[i] = k + step
    return z


def cut(z: np.ndarray, num_clusters: int) -> np.ndarray:
    """Flat labels ``0..M-1`` from linkage ``z``: undo the last ``M - 1`` merges.

    Labels are numbered in the order of each cluster's smallest member, so the result is deterministic.
    """
    k = len(z) + 1
    if not 1 <= num_clusters <= k:
        raise ValueError(f"number of groups must be in [1, {k}] for {k} clients, got {num_clusters}")
    parent = list(range(2 * k - 1))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for step in range(k - num_clusters):
        a, b = int(z[step, 0]), int(z[step, 1])
        parent[find(a)] = k + step
        parent[find(b)] = k + step
    roots = [find(i) for i in range(k)]
    order: dict[int, int] = {}
    for r in roots:
        order.setdefault(r, len(order))
    return np.array([order[r] for r in roots], dtype=np.int64)


def leaf_order(z: np.ndarray) -> np.ndarray:
    """Leaves of the dendrogram left to right (for plotting a similarity matrix ordered by cluster)."""
    k = len(z) + 1
    if k == 1:
        return np.array([0])
    children = {k + s: (int(z[s, 0]), int(z[s, 1])) for s in range(k - 1)}
    out, stack = [], [2 * k - 2]
    while stack:
        node = stack.pop()
        if node < k:
            out.append(node)
        else:
            a, b = children[node]
            stack += [b, a]
    return np.array(out, dtype=np.int64)


def ward_groups(dist: np.ndarray, num_clusters: int) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, linkage)``: Ward clustering of a distance matrix cut into ``num_clusters`` groups."""
    z = ward_linkage(dist)
    return cut(z, num_clusters), z


def adjusted_rand_index(a: np.ndarray | list, b: np.ndarray | list) -> float:
    """Adjusted Rand index of two labelings of the same items (1 = identical partitions, ~0 = chance)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        raise ValueError("labelings must have the same length")
    n = len(a)
    if n < 2:
        return 1.0
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    table = np.zeros((ai.max() + 1, bi.max() + 1))
    np.add.at(table, (ai, bi), 1)

    def comb2(x: np.ndarray) -> float:
        return float((x * (x - 1) / 2).sum())

    index = comb2(table)
    sa, sb = comb2(table.sum(1)), comb2(table.sum(0))
    expected = sa * sb / (n * (n - 1) / 2)
    maximum = 0.5 * (sa + sb)
    if maximum == expected:  # both labelings trivial (one cluster each, or all singletons)
        return 1.0
    return (index - expected) / (maximum - expected)


def clustering_report(record: Mapping, train_counts: Sequence[Sequence[int]]) -> dict:
    """What the users of FedALP want to see about one clustering (a record of ``server["clusterings"]``):

    the group of each client against its dominant training class, the adjusted Rand index of the groups against
    the dominant-class groups, the group-by-class contingency table, the per-group layer weights ``Psi_m`` and
    ``delta_m / max(delta_m)``, and the client order (by group, then dominant class) for plotting ``rho``.
    ``train_counts`` is the per-client class-count matrix (``partition.json``'s ``train_counts``).
    """
    cids = list(record["clients"])
    labels = np.asarray(record["labels"])
    counts = np.asarray(train_counts)
    dominant = counts[cids].argmax(1)
    num_groups, num_classes = int(labels.max()) + 1, counts.shape[1]
    table = np.zeros((num_groups, num_classes), dtype=np.int64)
    np.add.at(table, (labels, dominant), 1)
    order = sorted(range(len(cids)), key=lambda i: (labels[i], dominant[i], cids[i]))
    return {
        "round": record["round"],
        "clients": cids,
        "group": labels.tolist(),
        "dominant_class": dominant.tolist(),
        "ari_vs_dominant_class": adjusted_rand_index(labels, dominant),
        "group_by_class": table.tolist(),
        "group_sizes": record["group_sizes"],
        "psi": record["psi"],
        "delta_rel": record["delta_rel"],
        "beta": record["beta"],
        "similarity": record["similarity"],
        "linkage_input": record["linkage_input"],
        "order_by_group": [cids[i] for i in order],
    }
