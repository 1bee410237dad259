"""Small functional networks for server-side learners (pFedRLLA's DDPG agent and model-embedding network).

Every network is a plain ``dict[str, Tensor]`` of parameters and every optimizer state is a dict of tensors and
numbers, so they live inside a method's server state and go through checkpoints and the process backend as data.
"""
