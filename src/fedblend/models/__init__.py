"""Model zoo with declared ordered layers and a body/head split."""

from fedblend.models.zoo import MODELS, FedModel, build_model, init_params, initial_model, load_initial_weights, model_params

__all__ = ["MODELS", "FedModel", "build_model", "init_params", "initial_model", "load_initial_weights",
           "model_params"]
