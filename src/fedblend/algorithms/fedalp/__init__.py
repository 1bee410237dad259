"""FedALP (Xie, Liu, Qu, Tang, Zhao: "FedALP: An Adaptive Layer-Based Approach for Improved Personalized
Federated Learning", 2022): FedAvg warm-up, clustering of clients by their updates, then hierarchical training
in which each group trains from a layer-wise mix of its group model and the global model.

Phases (paper Algorithm 1 and 2):

1. **Warm-up** (rounds ``1..T_pre``): plain FedAvg (Eq. 1-2). The server remembers each client's last update
   ``dw_k = (trained model) - (model received)``.
2. **Clustering and layer weights**, at the end of round ``T_pre`` (Algorithm 2): ``rho = S(dW)`` (Eq. 3-4,
   :func:`~fedblend.algorithms.fedalp.clustering.cosine_similarity`); Ward hierarchical clustering of ``rho`` cut into
   ``M`` groups; per group ``D_m = sum_k gamma_k dw_k`` (Eq. 5, within-group data weights, "average gradient of
   the clients within group m", Table 1), ``delta_m^(l) = ||D_m^(l)||_2`` per layer (Eq. 6-7) and
   ``Psi_m = beta * delta_m / max(delta_m)`` (Eq. 8, :func:`layer_weights`). Group models start at the global
   model (Algorithm 1 line 3).
3. **Hierarchical training** (rounds ``T_pre+1..T``): group ``m``'s clients receive
   ``W_new^(l) = Psi_m^(l) w_m^(l) + (1 - Psi_m^(l)) w_g^(l)`` (Eq. 9-10, :func:`mix_by_layer`); each trains
   and returns ``dw_k``; ``w_m <- w_m + sum_{k in G_m} gamma_k dw_k`` (Algorithm 1 line 10, within-group data
   weights); ``w_g <- sum_m (sum_{k in G_m} gamma_k) w_m`` (line 11, :func:`global_from_groups`).

Evaluation: the personalized ("local") model of a client is its group's ``W_new`` (what the group server
broadcasts) by default (``local_model = "mixed"``); ``"group"`` evaluates the raw group model ``w_m``. The global
model ``w_g`` is evaluated on the same data every round (``global_accuracy``). Before clustering both are ``w_g``.

Open choices (the paper is silent; see ``docs/methods/fedalp.md``) are options, defaults in brackets:
``similarity`` [cosine: distance 1 - rho; "angular": arccos(rho) as Fraboni et al.'s code],
``linkage_input`` [condensed: Ward on the distance matrix; "rows": rows of the distance matrix as points, what
``scipy.linkage(square_matrix, "ward")`` in Fraboni et al.'s code does], ``layer_unit`` [layer: one weight per
model layer, weight and bias together; "tensor": one per parameter tensor], ``group_update`` [literal: line 10
as written; "mixed_start": ``w_m <- W_new + avg dw`` i.e. the mean of the group's trained models],
``recluster_every`` [0: once, as the paper].
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from fedblend.algorithms.fedalp import clustering
from fedblend.algorithms.fedalp.layer_mix import global_from_groups, layer_weights, mix_by_layer
from fedblend.algorithms.fedalp.options import FedALPOptions
from fedblend.algorithms.registry import register_method
from fedblend.common.params import Params, clone, flatten, unflatten, weighted_average
from fedblend.core.method import ClientCtx, Message, Method, RunInfo, ServerCtx, State, Traits


# --------------------------------------------------------------------------------------------- the method
@register_method
class FedALP(Method):
    name = "fedalp"
    display_name = "FedALP"
    options_cls = FedALPOptions
    paper = "Xie et al., FedALP: An Adaptive Layer-Based Approach for Improved Personalized Federated Learning, 2022"
    def declare(self, choice: str) -> Traits:
        """A FedALP client always trains the W_new it receives; it keeps a model only when a transform (e.g. ALA
        in "fedalp+ala") blends W_new with the client's previous model."""
        group = "the client's group model w_m (the global model before clustering)"
        # (its personalized_params builds the received model itself: the template's client_init is not it)
        return Traits(keeps_model=False, evaluates_received_model=False,
                      eval_model=group if self.opts.local_model == "group" else "{}")

    def eval_models(self) -> dict[str, str]:
        # what its group server broadcasts, i.e. what it would receive
        return {"received": "the client's group model mixed layer-wise with the latest global model (Eq. 9, what "
                            "the group server broadcasts); the global model before clustering"}

    # ------------------------------------------------------------------------------------ helpers
    def t_pre(self, run: RunInfo) -> int:
        """Warm-up length: ``t_pre`` rounds, or ``max(1, round(t_pre_fraction * T))``."""
        return self.opts.t_pre if self.opts.t_pre > 0 else max(1, int(round(self.opts.t_pre_fraction * run.rounds)))

    def start_model(self, server: State, cid: int) -> Params:
        """The model client ``cid`` trains from: ``W_new`` of its group, or the global model when unassigned."""
        groups = server.get("groups")
        if groups is None or groups[cid] < 0:
            return server["global"]
        m = groups[cid]
        return mix_by_layer(server["group_models"][m], server["global"], server["psi"][m], self.opts.layer_unit)

    def cluster(self, server: State, run: RunInfo, rnd: int) -> State:
        """Algorithm 2 on the clients' latest updates; returns the server with groups, Psi and group models."""
        opts = self.opts
        last: dict[int, torch.Tensor] = server["last_update"]
        cids = sorted(last)
        groups = [-1] * run.num_clients
        sizes = server["num_samples"]
        like = server["global"]
        if not cids:
            return server
        mat = torch.stack([last[c] for c in cids]).double().cpu().numpy()
        rho = clustering.cosine_similarity(mat)
        dist = clustering.similarity_to_distance(rho, opts.similarity)
        if opts.linkage_input == "rows":
            dist = clustering.rows_as_points_distance(dist)
        m_eff = min(opts.num_groups, len(cids))
        labels, z = clustering.ward_groups(dist, m_eff)
        for c, g in zip(cids, labels):
            groups[c] = int(g)
        psi, deltas, shares = [], [], []
        for m in range(m_eff):
            members = [c for c in cids if groups[c] == m]
            w = np.array([sizes[c] for c in members], dtype=np.float64)
            stacked = torch.stack([last[c] for c in members]).double()
            d_m = (torch.from_numpy(w / w.sum()).to(stacked.device).view(-1, 1) * stacked).sum(0)
            upd = unflatten(d_m, {k: v.double() for k, v in like.items()})
            psi.append(layer_weights(upd, opts.beta, opts.layer_unit))
            deltas.append(layer_weights(upd, 1.0, opts.layer_unit))  # delta / max(delta), for diagnostics
            shares.append(float(w.sum()))
        old_groups = server.get("groups")
        if old_groups is None:  # Algorithm 1 line 3: w_m <- w_g
            models = [clone(like) for _ in range(m_eff)]
        else:  # re-clustering: a new group starts from the data-weighted mean of its members' previous models
            models = []
            for m in range(m_eff):
                members = [c for c in cids if groups[c] == m]
                prev = [server["group_models"][old_groups[c]] if old_groups[c] >= 0 else like for c in members]
                models.append(weighted_average(prev, [sizes[c] for c in members]))
        record = {"round": rnd + 1, "clients": cids, "labels": [int(x) for x in labels],
                  "rho": torch.from_numpy(rho).float(), "linkage": torch.from_numpy(z),
                  "leaf_order": clustering.leaf_order(z).tolist(), "psi": psi, "delta_rel": deltas,
                  "group_sizes": [int((labels == m).sum()) for m in range(m_eff)], "group_samples": shares,
                  "similarity": opts.similarity, "linkage_input": opts.linkage_input, "beta": opts.beta}
        return {**server, "groups": groups, "psi": psi, "group_models": models,
                "clusterings": list(server.get("clusterings", [])) + [record]}

    # ------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        """``num_samples``: the data sizes clients reported with their uploads (the server knows no others)."""
        return {"global": clone(sctx.run.init_params), "groups": None, "last_update": {}, "clusterings": [],
                "num_samples": {}}

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message({"params": self.start_model(server, cid)})

    def configure_evaluate(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The client's ``W_new`` (``"params"``), the global model, and with ``local_model = "group"`` the raw
        group model ``w_m`` (``"personal"``)."""
        msg = Message({"params": self.start_model(server, cid), "global": server["global"]})
        groups = server.get("groups")
        if self.opts.local_model == "group" and groups is not None and groups[cid] >= 0:
            msg.arrays["personal"] = server["group_models"][groups[cid]]
        return msg

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        rnd, t_pre = sctx.rnd, self.t_pre(sctx.run)
        cids = sorted(replies)
        uploads = {c: replies[c].params() for c in cids}
        sizes = {c: replies[c].metrics["num_samples"] for c in cids}
        starts = {c: self.start_model(server, c) for c in cids}
        updates = {c: {n: uploads[c][n] - starts[c][n] for n in starts[c]} for c in cids}
        last = dict(server["last_update"])
        for c in cids:
            last[c] = flatten(updates[c], torch.float32)
        server = {**server, "last_update": last, "num_samples": {**server["num_samples"], **sizes}}
        if server["groups"] is None:  # warm-up: FedAvg (Algorithm 1 line 1)
            avg = weighted_average([uploads[c] for c in cids], [sizes[c] for c in cids])
            server = {**server, "global": {**server["global"], **avg}}
            if rnd + 1 == t_pre:
                server = self.cluster(server, sctx.run, rnd)
            return server
        return self.hierarchical_step(server, uploads, sizes, updates, sctx)

    def hierarchical_step(self, server: State, uploads: Mapping[int, Params], sizes: Mapping[int, int],
                          updates: Mapping[int, Params], sctx: ServerCtx) -> State:
        """Algorithm 1 lines 5-11 for the clients that joined this round."""
        opts, rnd, t_pre, run = self.opts, sctx.rnd, self.t_pre(sctx.run), sctx.run
        known = server["num_samples"]
        groups = list(server["groups"])
        models = list(server["group_models"])
        num_groups = len(models)
        # clients never clustered (not sampled before T_pre) join the group whose mean update is closest
        for c in sorted(uploads):
            if groups[c] < 0:
                groups[c] = self._nearest_group(server, groups, flatten(updates[c], torch.float32), run)
        for m in range(num_groups):
            members = [c for c in sorted(uploads) if groups[c] == m]
            if not members:
                continue
            step = weighted_average([updates[c] for c in members], [sizes[c] for c in members])
            if opts.step_weights == "federation":
                scale = sum(sizes[c] for c in members) / float(sum(known.values()))
                step = {n: scale * v for n, v in step.items()}
            base = models[m] if opts.group_update == "literal" else mix_by_layer(
                models[m], server["global"], server["psi"][m], opts.layer_unit)
            models[m] = {n: base[n] + step[n] for n in base}
        pool = sorted(known) if opts.global_weights == "members" else sorted(uploads)
        shares = [float(sum(known[c] for c in pool if groups[c] == m)) for m in range(num_groups)]
        server = {**server, "groups": groups, "group_models": models,
                  "global": global_from_groups(models, shares)}
        if opts.recluster_every > 0 and (rnd + 1 - t_pre) % opts.recluster_every == 0:
            server = self.cluster(server, run, rnd)
        return server

    def _nearest_group(self, server: State, groups: list[int], update: torch.Tensor, run: RunInfo) -> int:
        last = server["last_update"]
        best, best_sim = 0, -2.0
        for m in range(len(server["group_models"])):
            members = [c for c in range(run.num_clients) if groups[c] == m and c in last]
            if not members:
                continue
            centre = torch.stack([last[c] for c in members]).double().mean(0)
            sim = float(torch.nn.functional.cosine_similarity(centre, update.double(), dim=0))
            if sim > best_sim:
                best, best_sim = m, sim
        return best

    # ------------------------------------------------------------------------------------ evaluation
    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """``W_new`` of the client's group (or the raw group model ``w_m`` with ``local_model = "group"``); the
        global model before clustering (both arrive in the evaluation message)."""
        return msg.arrays.get("personal") or msg.params()
