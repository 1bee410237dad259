"""The pieces of the message-based interface: the state codec, messages, training specs (loss terms that see
features, steps, partial training keeps momentum), model features/head, the training generator protocol, the
process backend's failure modes, and the device / backend config fields."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedblend.algorithms.fedavg import FedAvg
from fedblend.common.codec import TREE, CodecError, decode, encode, to_device
from fedblend.common.options import ConfigError
from fedblend.core.client import drive
from fedblend.core.message import Message, comm_bytes
from fedblend.core.template import client_train, record_training, train_spec
from fedblend.core.training import LossTerm, TrainConfig, TrainResult, TrainSpec, merge_momentum, sgd_train
from fedblend.models.zoo import build_model
from tests.helpers import run_client, same_state, tiny_sim, train_message


# ------------------------------------------------------------------------------------------------ codec
def test_codec_round_trip_of_every_kind_of_leaf():
    t = torch.randn(3, 2)
    state = {"params": {"fc.weight": t, "fc.bias": torch.zeros(2, dtype=torch.float64)},
             7: [t, (1, 2.5, float("nan"), float("-inf"), None, True, "s")], "half": torch.ones(2, dtype=torch.bfloat16),
             "idx": torch.arange(4), "np": np.arange(3.0), "empty": {}, "nested": [[{"a": []}]]}
    for as_numpy in (False, True):
        flat = encode(state, as_numpy=as_numpy)
        assert TREE in flat and all(isinstance(v, np.ndarray if as_numpy else torch.Tensor) for v in flat.values())
        back = decode(flat)
        assert same_state(back["params"], state["params"]) and back["half"].dtype == torch.bfloat16
        assert back[7][1][:2] == (1, 2.5) and math.isnan(back[7][1][2]) and back[7][1][3] == -math.inf
        assert back[7][1][4:] == (None, True, "s") and isinstance(back[7][1], tuple)
        assert list(back) == list(state)  # key order and key types (int 7) kept
        assert back[7][0] is back["params"]["fc.weight"]  # a shared tensor stays one object
        assert isinstance(back["np"], np.ndarray) and back["empty"] == {} and back["nested"] == [[{"a": []}]]
    assert len([k for k in encode(state) if k != TREE]) == 5  # t stored once


def test_codec_rejects_what_is_not_data():
    with pytest.raises(CodecError, match="a/b"):
        encode({"a": {"b": lambda x: x}})
    with pytest.raises(CodecError, match="key"):
        encode({(1, 2): 3})


def test_to_device_moves_every_tensor_once_and_leaves_a_state_already_there_untouched():
    t = torch.randn(3)
    state = {"a": {"w": t, "n": 3, "s": "x"}, "l": [t, (torch.zeros(2, dtype=torch.float64), None)], 7: 1.5}
    assert to_device(state, "cpu") is state  # nothing to move: the very same objects, no copy
    moved = to_device(state, "meta")  # a second device every machine has (shapes and dtypes, no values)
    leaves = [moved["a"]["w"], moved["l"][0], moved["l"][1][0]]
    assert all(x.device.type == "meta" for x in leaves) and moved["l"][1][0].dtype == torch.float64
    assert moved["a"]["w"] is moved["l"][0]  # one tensor twice stays one object, as the codec keeps it
    assert isinstance(moved["l"][1], tuple) and moved["l"][1][1] is None and moved[7] == 1.5 and moved["a"]["s"] == "x"
    assert state["a"]["w"].device.type == "cpu"  # the input is not modified


# ------------------------------------------------------------------------------------------------ messages
def test_message_bytes_and_wire_round_trip():
    g = {"w": torch.ones(3), "b": torch.zeros(2, dtype=torch.float64)}
    msg = Message({"params": g, "global": g}, {"num_samples": 5}, {"split": "test"})
    assert msg.num_bytes == comm_bytes(msg) == 2 * (3 * 4 + 2 * 8)
    back = Message.from_arrays(msg.to_arrays())
    assert same_state(back.arrays, msg.arrays) and back.metrics == {"num_samples": 5} and back.config == {"split": "test"}
    assert back.params() is back.arrays["params"] and back.params("none") == {}


# ------------------------------------------------------------------------------------------------ models
@pytest.mark.parametrize("name,info", [("cnn4", {"in_channels": 1, "num_classes": 10, "image_size": 28}),
                                       ("lenet5", {"in_channels": 1, "num_classes": 10, "image_size": 28}),
                                       ("mlp", {"input_shape": (1, 28, 28), "num_classes": 10})])
def test_features_then_head_is_forward(name, info):
    m = build_model(name, info, torch.Generator().manual_seed(0))
    x = torch.randn(5, 1, 28, 28)
    z = m(x, part="features")
    assert torch.equal(m(z, part="head"), m(x))
    assert z.shape == (5, getattr(m, m.head_layers[-1]).in_features)  # the head's input
    with pytest.raises(ValueError, match="part"):
        m(x, part="nope")


# ------------------------------------------------------------------------------------------------ training specs
def _toy():
    m = build_model("mlp", {"input_shape": (4,), "num_classes": 3}, torch.Generator().manual_seed(1))
    m.requires_grad_(False)
    params = {k: v.detach().clone() for k, v in m.named_parameters()}
    g = torch.Generator().manual_seed(2)
    return m, params, torch.randn(12, 4, generator=g), torch.randint(0, 3, (12,), generator=g)


def test_loss_term_sees_batch_logits_and_features():
    m, params, x, y = _toy()
    seen = []

    def term(p, batch, scale):
        seen.append(batch)
        return scale * batch.features.sum()

    cfg = TrainConfig(lr=0.1, batch_size=5)
    a = sgd_train(m, params, x, y, cfg, torch.Generator().manual_seed(0),
                  loss_terms=[LossTerm(term, {"scale": 0.0}, needs_features=True)])
    b = sgd_train(m, params, x, y, cfg, torch.Generator().manual_seed(0))
    assert same_state(a.params, b.params)  # a zero term changes nothing; features + head == forward
    assert [len(s.y) for s in seen] == [5, 5, 2] and all(s.features.shape == (len(s.y), 50) for s in seen)
    first = torch.func.functional_call(m, params, (seen[0].x,))  # the first batch sees the starting parameters
    assert torch.allclose(seen[0].logits, first) and seen[0].logits.shape == (5, 3)


def test_loss_term_gradient_is_added():
    """A term ``c * sum(logits)`` adds ``c`` to every logit's gradient: check one SGD step by hand."""
    m, params, x, y = _toy()
    cfg = TrainConfig(lr=0.5, batch_size=12)
    c = 0.3
    res = sgd_train(m, params, x, y, cfg, torch.Generator().manual_seed(0),
                    loss_terms=[LossTerm(lambda p, b: c * b.logits.sum())])
    w = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    out = torch.func.functional_call(m, w, (x,))
    loss = F.cross_entropy(out, y) + c * out.sum()
    grads = torch.autograd.grad(loss, list(w.values()))
    want = {k: params[k] - 0.5 * g for k, g in zip(w, grads)}
    assert all(torch.allclose(res.params[k], want[k], atol=1e-6) for k in want)


def test_steps_instead_of_epochs():
    m, params, x, y = _toy()
    res = sgd_train(m, params, x, y, TrainConfig(lr=0.1, batch_size=5), torch.Generator().manual_seed(0), steps=7)
    assert res.steps == 7 and res.samples == 5 + 5 + 2 + 5 + 5 + 2 + 5  # crosses into a third epoch


def test_partial_training_keeps_momentum_of_untrained_tensors(tiny_fed):
    """FedRep-style head phase then body phase: each phase's buffers survive the other (optimizer_state keep)."""
    m, params, x, y = _toy()
    cfg = TrainConfig(lr=0.1, momentum=0.9, batch_size=6)
    head = sgd_train(m, params, x, y, cfg, torch.Generator().manual_seed(0), trainable=["fc2.weight", "fc2.bias"])
    kept = merge_momentum(None, head.momentum)
    body = sgd_train(m, head.params, x, y, cfg, torch.Generator().manual_seed(1), momentum=kept,
                     trainable=["fc1.weight", "fc1.bias"])
    kept2 = merge_momentum(kept, body.momentum)
    assert set(kept2) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert torch.equal(kept2["fc2.weight"], head.momentum["fc2.weight"])  # untouched by the body phase
    assert set(body.momentum) == {"fc1.weight", "fc1.bias"}


def test_two_phase_client_generator_through_the_runtime(tiny_fed):
    """A method whose client half yields two specs (head, then body) runs under the template's runtime, and
    momentum of both phases is kept in the client state."""
    class TwoPhase(FedAvg):
        name = "two-phase-test"

        def declare(self, choice):
            return dataclasses.replace(super().declare(choice), keeps_model=True)

        def local_training(self, params, msg, cstate, ctx):
            head = ctx.model.head_names()
            r1 = yield train_spec(self, params, msg, cstate, ctx, trainable=head, stream="head")
            cstate = record_training(r1, cstate, ctx)
            body = ctx.model.body_names()
            r2 = yield train_spec(self, r1.params, msg, cstate, ctx, trainable=body, stream="body")
            return r2, record_training(r2, cstate, ctx)

    sim = tiny_sim(tiny_fed, "fedavg", rounds=1, momentum=0.5, optimizer_state="keep")
    sim.method = TwoPhase()
    res = run_client(sim, 0, train_message(sim, 0))
    assert set(res.state["momentum"]) == set(sim.run_info.init_params)
    specs = []
    work = client_train(sim.method, train_message(sim, 0), sim.method.init_client(sim.client_ctx(0, 0)), sim.client_ctx(0, 0))

    def execute(spec):
        specs.append(spec)
        return TrainResult(spec.params, None, 0.0, 0, 0)

    reply, _ = drive(work, execute)
    assert [s.stream for s in specs] == ["head", "body"] and reply.metrics["num_samples"] == tiny_fed.clients[0].num_train


def test_train_spec_defaults_from_the_template(tiny_fed):
    sim = tiny_sim(tiny_fed, "fedprox", {"mu": 0.1}, rounds=1)
    msg = train_message(sim, 0)
    ctx = sim.client_ctx(0, 0)
    spec = train_spec(sim.method, sim.method.client_init(msg, {}, ctx), msg, {}, ctx)
    assert isinstance(spec, TrainSpec) and spec.trainable is None and spec.momentum is None
    assert [t.name for t in spec.loss_terms] == ["proximal"] and spec.stream == "batches"


# ------------------------------------------------------------------------------------------------ backends + config
class Broken(FedAvg):
    """A method whose client half fails (module level, so worker processes can unpickle it)."""

    name = "broken-test"

    def client_step(self, phase, msg, cstate, ctx):
        raise ValueError("boom")
        yield  # a generator, like every client half


def test_process_backend_worker_error_is_reported(tiny_fed):
    from fedblend.core.backends import ProcessBackend

    sim = tiny_sim(tiny_fed, "fedavg", rounds=1, backend=ProcessBackend(workers=1, threads=1))
    sim.method = Broken()
    from fedblend.common.errors import HookError

    with sim, pytest.raises(HookError, match=r"^method plug-in 'broken-test' \(tests.test_interface:Broken\) raised "
                                              r"in client_step \(client \d, round 1\): ValueError: boom"):
        sim.run_round()  # the worker's exception, named once by the parent (not a RuntimeError of tracebacks)


def test_device_backend_fields(tmp_path):
    from fedblend.config import load_config

    cfg = load_config(None, ["dataset='synthetic'", "model='mlp'", "device='auto'", "backend='processes'", "workers=3"])
    assert cfg.resolved_device() in ("cpu", "cuda") and cfg.backend == "processes" and cfg.workers == 3
    for bad, field in [("device='tpu'", "device"), ("backend='threads'", "backend"), ("workers=0", "workers")]:
        with pytest.raises(ConfigError, match=field):
            load_config(None, [bad])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="cuda"):
            load_config(None, ["device='cuda'"]).resolved_device()


def test_cli_runs_with_the_process_backend(tmp_path):
    import json

    from fedblend.cli.main import main

    out = tmp_path / "run"
    rc = main(["run", "--set", "dataset='synthetic'", "--set", "model='mlp'", "--set", "rounds=2", "--set",
               "partition.num_clients=4", "--set", "partition.min_samples=5", "--backend", "processes", "--workers", "2",
               "--threads", "1", "--quiet", "--out", str(out)])
    assert rc == 0
    seq = tmp_path / "seq"
    assert main(["run", "--set", "dataset='synthetic'", "--set", "model='mlp'", "--set", "rounds=2", "--set",
                 "partition.num_clients=4", "--set", "partition.min_samples=5", "--threads", "1", "--quiet",
                 "--out", str(seq)]) == 0
    a = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    b = [json.loads(x) for x in (seq / "metrics.jsonl").read_text().splitlines()]
    assert [m["acc"] for m in a] == [m["acc"] for m in b] and 'backend = "processes"' in (out / "config.toml").read_text()


def test_own_loop_is_declared():
    from fedblend.algorithms import build_method

    assert not build_method("fedprox").traits.own_loop
    assert build_method("fedprox+ala").traits.own_loop and build_method("fedala").traits.own_loop


def test_traits_are_one_frozen_value_resolved_from_options_and_transforms():

    from fedblend.algorithms import METHODS, build_method
    from fedblend.core.method import Method, Traits

    apa = build_method("fedapa", {"sequential": False})
    assert build_method("fedapa", {"sequential": True}).traits.sequential_server and not apa.traits.sequential_server
    with pytest.raises(dataclasses.FrozenInstanceError):
        apa.traits.sequential_server = True
    # an option that makes the client keep its model; a transform that needs one
    assert build_method("fedphp", eval_choice="trained").traits.keeps_model and not build_method("fedphp").traits.keeps_model
    assert not build_method("fedavg").traits.keeps_model and build_method("fedavg+ala").traits.keeps_model
    # the evaluation description composes the transform's and the method's own wrapping
    assert build_method("fedprox+ala").traits.eval_model != build_method("fedprox").traits.eval_model
    assert build_method("fedalp", {"local_model": "group"}).traits.eval_model.startswith("the client's group model")
    # no behaviour flag is a property a runtime could read instead of the traits
    for cls in METHODS.values():
        for name in {f.name for f in dataclasses.fields(Traits)}:
            assert not isinstance(getattr(cls, name, None), property), f"{cls.name}.{name} is a property"
    with pytest.raises(TypeError, match="keep_model"):
        Traits(keep_model=True)
    # a trait written as a class attribute or property (nothing would read it) is refused where the class is
    # written; the former class declarations of a plug-in are mapped (tests/test_plugins_legacy.py)
    for name in ("sequential_server", "keeps_model", "own_loop", "per_client_stats", "global_model",
                 "reports_global", "eval_transforms", "eval_choice"):
        with pytest.raises(TypeError, match=f"defines {name} as a class attribute"):
            type("Stale", (Method,), {name: property(lambda self: True)})
    with pytest.raises(TypeError, match="resolve_traits"):
        type("Stale", (Method,), {"resolve_traits": lambda self, **declared: None})
    # declared and resolved-only fields are kept apart: a declaration that sets a resolved one is refused
    class SetsChoice(Method):
        def declare(self, choice):
            return Traits(eval_choice="trained")
    with pytest.raises(TypeError, match="resolved from the transforms"):
        SetsChoice()


def test_bench_command_times_engine_and_plain_loop(capsys):
    import json

    from fedblend.cli.main import main

    rc = main(["bench", "--set", "dataset='synthetic'", "--set", "model='mlp'", "--set", "partition.num_clients=4",
               "--set", "partition.min_samples=5", "--set", "sampling.join_ratio=0.5", "--rounds", "2"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    for k in ("train_ratio", "eval_ratio", "round_ratio", "samples_per_s", "clients_per_s", "peak_rss_mib"):
        assert out[k] > 0, k
    assert out["train_flops_per_sample"] > 0 and 0 < out["fraction_of_peak"] < 1
    assert out["fraction_of_peak"] == pytest.approx(out["samples_per_s"] * out["train_flops_per_sample"] / out["peak_flops"])
    assert out["rounds"] == 2 and out["backend"] == "sequential" and [r["round"] for r in out["per_round"]] == [1, 2]
    assert out["train_engine_s"] == pytest.approx(sum(r["train_engine_s"] for r in out["per_round"]) / 2)
    assert out["clients_per_s"] == pytest.approx(2 / out["train_engine_s"])  # 2 of 4 clients join each round


@pytest.mark.parametrize("spec,kw", [("fedavg", {}), ("fedprox", {"options": {"mu": 0.5}}),
                                     ("fedavg", {"momentum": 0.9, "optimizer_state": "keep", "weight_decay": 0.01}),
                                     ("fedapa", {"momentum": 0.5}), ("local", {})])
def test_vmap_backend_equals_sequential_within_tolerance(spec, kw, tiny_fed):
    from fedblend.core.vmap import VmapBackend

    a = tiny_sim(tiny_fed, spec, rounds=3, seed=1, join_ratio=0.75, **kw)
    b = tiny_sim(tiny_fed, spec, rounds=3, seed=1, join_ratio=0.75, backend=VmapBackend(), **kw)
    a.run(), b.run()
    for cid, st in a.store.states.items():  # every client's kept model / momentum, and the server's model
        for key in ("params", "momentum"):
            for n, t in st.get(key, {}).items():
                assert torch.allclose(t, b.store.states[cid][key][n], atol=1e-6), (cid, key, n)
    for n, t in (a.server.get("global") or {}).items():
        assert torch.allclose(t, b.server["global"][n], atol=1e-6)
    assert [m["selected"] for m in a.history] == [m["selected"] for m in b.history]
    for ma, mb in zip(a.history, b.history):
        assert ma["train_loss"] == pytest.approx(mb["train_loss"], rel=1e-5)


def test_vmap_backend_partial_training_and_fallback(tiny_fed):
    """A two-spec (head, then body) client half batched, and ALA (own loop) falls back with one notice."""
    from fedblend.core.vmap import VmapBackend

    class HeadThenBody(FedAvg):
        name = "head-then-body-test"

        def declare(self, choice):
            return dataclasses.replace(super().declare(choice), keeps_model=True)

        def local_training(self, params, msg, cstate, ctx):
            r1 = yield train_spec(self, params, msg, cstate, ctx, trainable=ctx.model.head_names(), stream="head")
            cstate = record_training(r1, cstate, ctx)
            r2 = yield train_spec(self, r1.params, msg, cstate, ctx, trainable=ctx.model.body_names(), stream="body")
            return r2, record_training(r2, cstate, ctx)

    runs = []
    for backend in (None, VmapBackend()):
        sim = tiny_sim(tiny_fed, "fedavg", rounds=2, momentum=0.5, optimizer_state="keep", backend=backend)
        sim.method = HeadThenBody()
        sim.run()
        runs.append(sim)
    for cid, st in runs[0].store.states.items():
        assert set(st["momentum"]) == set(runs[0].run_info.init_params)
        for n, t in st["params"].items():
            assert torch.allclose(t, runs[1].store.states[cid]["params"][n], atol=1e-6)
    with pytest.warns(RuntimeWarning, match="own loop"):
        tiny_sim(tiny_fed, "fedavg+ala", rounds=2, backend=VmapBackend()).run()


@pytest.mark.parametrize("spec,passes", [("fedavg", 1), ("fedapa", 1), ("fedavg+ala", 2)])
def test_vmap_evaluation_batched_across_clients_equals_per_client(spec, passes, tiny_fed, monkeypatch):
    """Clients sharing a model are scored in one pass (FedAvg: one pass for all), the clients' own models in one
    stacked pass (FedAPA: 4 models; with ALA: 4 blended models stacked plus one pass of the shared global model);
    counts are exact, losses equal within float tolerance."""
    import fedblend.core.vmap as vm
    from fedblend.core.vmap import VmapBackend

    calls = []
    real, real_stacked = vm.evaluate_shared, vm.evaluate_stacked
    monkeypatch.setattr(vm, "evaluate_shared", lambda *a: calls.append(len(a[2])) or real(*a))
    monkeypatch.setattr(vm, "evaluate_stacked", lambda *a: calls.append(len(a[1])) or real_stacked(*a))

    a = tiny_sim(tiny_fed, spec, rounds=2)
    a.run()
    b = tiny_sim(tiny_fed, spec, rounds=2)
    b.server, b.store.states, b.next_round = a.server, a.store.states, a.next_round
    b.backend = VmapBackend(stack_eval=True)
    ea, eb = a.evaluate(1), b.evaluate(1)
    assert len(calls) == passes and sum(calls) == tiny_fed.num_clients * (2 if "global_acc" in ea else 1)
    assert ea.keys() == eb.keys()
    for k in ea:
        if k.endswith("per_client"):  # each client's integer counts: the pooled numbers are sums of them
            assert eb[k] == ea[k], k
        else:
            assert eb[k] == pytest.approx(ea[k], rel=1e-6, abs=1e-9), k


@pytest.mark.parametrize("method", ["fedavg", "ditto", "fedrep", "fedfomo"])
def test_a_client_with_fewer_samples_than_a_batch_under_drop_last_reports_no_loss_and_is_no_divergence(method, tiny_fed):
    """The template, for every method: with ``train.drop_last`` a client smaller than one batch trains nothing
    (PFLlib's loader skips it); it reports no ``train_loss`` (the round's loss is the other clients' mean), and
    the run goes on instead of stopping on a NaN."""
    small = min(range(len(tiny_fed.clients)), key=lambda c: tiny_fed.clients[c].num_train)
    bs = tiny_fed.clients[small].num_train + 1
    assert any(c.num_train >= bs for c in tiny_fed.clients)
    sim = tiny_sim(tiny_fed, method, rounds=2, seed=0, batch_size=bs, drop_last=True)
    sim.run()
    assert len(sim.history) == 2
    assert all(math.isfinite(h["train_loss"]) for h in sim.history)


@pytest.mark.parametrize("method", ["fedavg", "ditto", "fedrep"])
def test_each_clients_losses_are_recorded_per_client_and_average_to_the_rounds_loss(method, tiny_fed):
    """``stats_per_client`` keeps every loss each training client reported (``train_loss``, Ditto's
    ``personal_loss``, FedRep's ``head_loss``) in the order of ``selected``; the round's pooled field is their
    mean, and a client that trained no batch (smaller than one batch under ``drop_last``) is not listed."""
    small = min(range(len(tiny_fed.clients)), key=lambda c: tiny_fed.clients[c].num_train)
    bs = tiny_fed.clients[small].num_train + 1
    sim = tiny_sim(tiny_fed, method, rounds=2, seed=0, batch_size=bs, drop_last=True)
    sim.run()
    extra = {"fedavg": [], "ditto": ["personal_loss"], "fedrep": ["head_loss"]}[method]
    for h in sim.history:
        pc = h["stats_per_client"]
        assert small in h["selected"] and small not in pc["clients"]
        assert pc["clients"] == [c for c in h["selected"] if tiny_fed.clients[c].num_train >= bs]
        assert sorted(k for k in pc if k != "clients") == sorted(["train_loss", *extra])
        for key in ["train_loss", *extra]:
            assert len(pc[key]) == len(pc["clients"]) and all(math.isfinite(v) for v in pc[key])
            assert sum(pc[key]) / len(pc[key]) == h[key]
        assert len(set(pc["train_loss"])) == len(pc["clients"])  # each client's own number, not the mean copied


@pytest.mark.parametrize("case", ["epochs", "steps", "drop_last", "momentum_some_kept", "proximal_trainable",
                                  "lr_and_batch"])
def test_batched_sgd_equals_sgd_train_per_client_on_ragged_clients(case):
    """The vmap backend's batched driver against the sequential one, client by client, on clients of very
    different sizes (1 to 57 samples: different step counts, partial last batches, a client without a batch
    under drop_last): same batches drawn from each client's stream, parameters and buffers within float
    reassociation, the same step and sample counts, mean losses within tolerance."""
    from types import SimpleNamespace

    from fedblend.algorithms.parts.proximal import proximal_term
    from fedblend.core.vmap import batched_sgd

    info = {"input_shape": (1, 8, 8), "num_classes": 4}
    model = build_model("mlp", info, torch.Generator().manual_seed(0))
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    sizes = [57, 1, 23, 10, 9, 40]
    datas = [SimpleNamespace(train_x=torch.randn(n, 1, 8, 8, generator=gen), train_y=torch.randint(0, 4, (n,), generator=gen))
             for n in sizes]
    cfg = TrainConfig(lr=0.1, batch_size=10, epochs=2, momentum=0.9 if case == "momentum_some_kept" else 0.0,
                      weight_decay=0.01, drop_last=case == "drop_last")
    specs = []
    for c in range(len(sizes)):
        start = {k: v + 0.01 * c for k, v in init.items()}
        kw = {}
        if case == "steps":
            kw["steps"] = 3
        if case == "momentum_some_kept" and c % 2:
            kw["momentum"] = {k: torch.full_like(v, 0.1 * c) for k, v in init.items()}
        if case == "proximal_trainable":
            kw["trainable"] = model.head_names()
            kw["loss_terms"] = (proximal_term({k: v - 0.05 for k, v in start.items()}, 0.5),)
        if case == "lr_and_batch":
            kw.update(lr=0.03, batch_size=4, epochs=1)
        specs.append(TrainSpec(start, **kw))
    batched = batched_sgd(model, specs, datas, [torch.Generator().manual_seed(10 + c) for c in range(len(sizes))], cfg)
    for c, (spec, d) in enumerate(zip(specs, datas)):
        one = sgd_train(model, spec.params, d.train_x, d.train_y, cfg, torch.Generator().manual_seed(10 + c),
                        momentum=spec.momentum, loss_terms=spec.loss_terms, trainable=spec.trainable,
                        epochs=spec.epochs, lr=spec.lr, steps=spec.steps, batch_size=spec.batch_size)
        got = batched[c]
        assert (got.steps, got.samples) == (one.steps, one.samples), c
        for n, t in one.params.items():
            assert torch.allclose(got.params[n], t, atol=1e-6, rtol=1e-5), (c, n)
        assert (got.momentum is None) == (one.momentum is None), c
        for n, t in (one.momentum or {}).items():
            assert torch.allclose(got.momentum[n], t, atol=1e-6, rtol=1e-5), (c, n)
        if one.steps:
            assert got.mean_loss == pytest.approx(one.mean_loss, rel=1e-5), c
        else:
            assert math.isnan(got.mean_loss) and math.isnan(one.mean_loss)
    if case != "steps":
        assert any(r.steps != batched[0].steps for r in batched)  # really ragged


def test_bench_backends_times_each_backend_on_the_same_rounds_and_they_agree(capsys):
    """``fedblend bench --backends sequential,vmap``: both backends run the same rounds, their accuracies agree
    within float tolerance, speed-ups are relative to the first, the FLOPs and the fraction of the peak are
    reported; a bad list is refused as bad input (``bookkeeping/gpu_speed.py``, which writes the same as
    speed.json: tests/bookkeeping/test_gpu_speed_script.py)."""
    import json

    from fedblend.cli.main import main

    flags = ["--set", "dataset='synthetic'", "--set", "model='mlp'", "--set", "partition.num_clients=4",
             "--set", "partition.min_samples=5", "--rounds", "2"]
    assert main(["bench", *flags, "--backends", "sequential,vmap"]) == 0
    out = json.loads(capsys.readouterr().out)
    seq, vm = out["backends"]["sequential"], out["backends"]["vmap"]
    assert seq["speedup_vs_sequential"] == 1.0 and vm["speedup_vs_sequential"] > 0
    assert vm["accuracy"] == pytest.approx(seq["accuracy"], abs=1e-3)
    # MLP 64-50-4: forward and weight gradients 2 x (64*50 + 50*4) FLOPs each, the hidden layer's input gradient
    # 2 x 50*4 (the first layer's input needs none)
    assert out["train_flops_per_sample"] == 2 * 2 * (64 * 50 + 50 * 4) + 2 * 50 * 4
    assert 0 < vm["fraction_of_peak"] < 1 and out["peak_flops"] > 0
    assert len(seq["train_s_by_round"]) == 2
    assert main(["bench", *flags, "--backends", "sequential,warp"]) == 2
    assert "--backends" in capsys.readouterr().err
