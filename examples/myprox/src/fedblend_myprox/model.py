"""A model plug-in: a two-layer network with fedblend's layer metadata (``layers``, ``head_layers``,
``features``, ``head``), built from the dataset's ``info`` dict."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fedblend.models.zoo import FedModel


class TinyNet(FedModel):
    layers = ("fc1", "fc")
    head_layers = ("fc",)

    def __init__(self, info: dict, hidden: int = 16):
        super().__init__()
        self.fc1 = nn.Linear(int(math.prod(info["input_shape"])), hidden)
        self.fc = nn.Linear(hidden, info["num_classes"])

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc1(x.flatten(1)))

    def head(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc(z)
