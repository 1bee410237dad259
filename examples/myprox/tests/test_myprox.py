"""The package's methods pass fedblend's shared contract suite: one import, one class per method."""

from fedblend.testing import MethodContract


class TestMyProx(MethodContract):
    method = "myprox"  # the entry point's name (installed package); "fedblend_myprox.method:MyProx" works too
    options = {"mu": 0.01}


class TestMyProxWithMix(MethodContract):
    method = "myprox+mix"
    transforms = {"mix": {"beta": 0.3}}
    model = "tinynet"  # the package's own model plug-in
    process_backend = False  # one process-backend check per package is enough here
