"""FedALP's options (:mod:`fedblend.algorithms.fedalp`): the paper's settings and, where the paper is silent or
Fraboni et al.'s clustering code differs, the choices named in docs/methods/fedalp.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedblend.common.options import opt


@dataclass(frozen=True)
class FedALPOptions:
    CHOICES: ClassVar[dict] = {"similarity": ("cosine", "angular"), "linkage_input": ("condensed", "rows"),
                               "layer_unit": ("layer", "tensor"), "group_update": ("literal", "mixed_start"),
                               "local_model": ("mixed", "group"), "global_weights": ("members", "participants"),
                               "step_weights": ("group", "federation")}
    RANGES: ClassVar[dict] = {"t_pre": "[0, 1000000]", "t_pre_fraction": "(0, 1)", "num_groups": "[1, 100000]", "beta": "[0, 1]",
                              "recluster_every": "[0, 1000000]"}

    t_pre: int = opt(0, "warm-up rounds T_pre; 0 = round(t_pre_fraction * rounds)")
    t_pre_fraction: float = opt(0.5, 'paper: T_pre is "typically 40% to 70%" of T')
    num_groups: int = opt(10, "M (paper silent; 10 = the number of classes / of Fraboni et al.'s clusters)")
    beta: float = opt(0.6, "personalization factor, paper Table 2 / Fig. 2")
    similarity: str = opt("cosine", '"cosine": distance 1 - rho; "angular": arccos(rho) (Fraboni et al.\'s code)')
    linkage_input: str = opt("condensed", '"condensed": Ward on the distance matrix; "rows": rows of the distance '
                                          'matrix as points (scipy.linkage(square_matrix, "ward") in Fraboni et al.\'s '
                                          "code)")
    layer_unit: str = opt("layer", '"layer": one weight per model layer, weight and bias together; "tensor": one per '
                                   "parameter tensor")
    group_update: str = opt("literal", '"literal": Alg. 1 line 10 as written; "mixed_start": w_m <- W_new + avg dw, '
                                       "the mean of the group's trained models")
    local_model: str = opt("mixed", 'the personalized model evaluated: "mixed" = the group\'s W_new (Eq. 9-10, what '
                                    'the group server broadcasts); "group" = the raw group model w_m')
    recluster_every: int = opt(0, "0 = cluster once at T_pre (paper); k > 0 = again every k rounds after T_pre")
    global_weights: str = opt("members", 'line 11\'s gamma_k: "members" = data of all clients of each group; '
                                         '"participants" = data of this round\'s participants only (FedAvg\'s gamma '
                                         "under partial participation; groups without participants get 0). With "
                                         'group_update = "mixed_start" and beta = 0, "participants" makes FedALP equal '
                                         "FedAvg exactly also when only some clients join each round.")
    step_weights: str = opt("group", 'line 10\'s gamma_k: "group" = n_k / (data of the group\'s clients that joined '
                                     "this round), so the group model takes the group's average update (Table 1: D_m "
                                     'is the "average gradient" of the group); "federation" = n_k / (data of all K '
                                     "clients), the same gamma_k as line 11, which scales each group's step by the "
                                     "joined members' share of the federation's data")
