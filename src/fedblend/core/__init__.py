"""Round engine, client execution backends, evaluation, sampling, client-state store, checkpoints, RNG."""
