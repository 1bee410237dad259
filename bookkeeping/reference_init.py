"""Write the initial weights a reference implementation draws, with fedblend's own model code (issue #51).

PFLlib (TsingZ0/PFLlib, ``system/main.py``) calls ``torch.manual_seed(0)`` once at import and then builds its model
with PyTorch's default initialisation; its first run therefore starts from the weights that fedblend's model of the
same layers gets from :func:`fedblend.models.zoo.build_model` with a generator seeded 0 (the same Kaiming-uniform /
uniform draws, module by module, in the same order). For ``cnn4`` = PFLlib's ``FedAvgCNN(in_features=1,
dim=1024)`` this was checked tensor for tensor against PFLlib's own constructors at d832e76, run beside this
repository (no PFLlib code is here): ``results/validation/init/README.md``.

    python bookkeeping/reference_init.py results/validation/init/pflib-seed0-cnn4-fmnist.pt \\
        --model cnn4 --input 1,28,28 --classes 10 --seed 0

Prints the sha256 of the tensors (names, shapes, dtypes and bytes in order; the file's own hash depends on its name,
which ``torch.save`` writes into the archive) and of the file; the ``init`` option of a config loads the file
in place of fedblend's own draw.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from fedblend.models.zoo import build_model  # noqa: E402


def reference_state(model: str, input_shape: tuple[int, ...], classes: int, seed: int) -> dict[str, torch.Tensor]:
    """The state_dict of ``model`` drawn as ``torch.manual_seed(seed)`` then the model's constructors would."""
    c, h = input_shape[0], input_shape[-1]
    info = {"input_shape": input_shape, "in_channels": c, "image_size": h, "num_classes": classes}
    net = build_model(model, info, generator=torch.Generator().manual_seed(seed))
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def tensors_sha256(state: dict[str, torch.Tensor]) -> str:
    """A hash of the tensors themselves: name, dtype, shape and bytes of each, in order."""
    h = hashlib.sha256()
    for k, v in state.items():
        h.update(f"{k}|{v.dtype}|{tuple(v.shape)}|".encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="cnn4")
    p.add_argument("--input", default="1,28,28", help="C,H,W of one sample")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="the reference's torch.manual_seed")
    a = p.parse_args(argv)
    state = reference_state(a.model, tuple(int(x) for x in a.input.split(",")), a.classes, a.seed)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, a.out)
    print(f"tensors sha256 {tensors_sha256(state)}")
    print(f"file sha256    {hashlib.sha256(a.out.read_bytes()).hexdigest()}  {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
