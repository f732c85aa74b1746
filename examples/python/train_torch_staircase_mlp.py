"""Train a non-differentiable PyTorch MLP without gradients, then move it back to PyTorch.

The MLP is defined in PyTorch with a staircase activation (``step * floor(x / step)``,
zero gradient almost everywhere, so backpropagation cannot train it). polyprobe converts
it (``Model.from_torch``), trains it on the embedded digits data, and hands the trained
weights back (``to_torch``); both frameworks then agree on the test accuracy.

    python3 examples/python/train_torch_staircase_mlp.py
"""
import os

import numpy as np
import torch
from torch import nn

import polyprobe
from polyprobe.torch import Staircase

FAST = os.environ.get("POLYPROBE_EXAMPLES_FAST") == "1"


def main() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), Staircase(0.5), nn.Linear(32, 10))
    data = polyprobe.load_data("digits")  # split and standardised as `polyprobe train` does
    x_test, y_test = data["test"]

    # Backprop gets nothing: the staircase's gradient is zero almost everywhere.
    x = torch.from_numpy(x_test).float()
    loss = nn.functional.cross_entropy(net(x), torch.from_numpy(y_test))
    loss.backward()
    print(f"gradient norm through the staircase: {net[0].weight.grad.norm().item():.1f}")

    model = polyprobe.Model.from_torch(net)
    result = polyprobe.train(model, *data["train"], validation=data["validation"],
                             epochs=2 if FAST else 20, progress=not FAST)
    print(f"trained {result.steps} steps in {result.seconds:.1f} s; best validation accuracy "
          f"{100 * result.best_validation_accuracy:.1f}% (epoch {result.best_epoch + 1}, restored)")

    trained = model.to_torch()
    with torch.no_grad():
        torch_acc = (trained(x).argmax(1).numpy() == y_test).mean()
    pp_acc = polyprobe.evaluate(model, x_test, y_test)["accuracy"]
    print(f"test accuracy: polyprobe {100 * pp_acc:.1f}%, PyTorch with the trained weights "
          f"{100 * torch_acc:.1f}%")
    assert abs(torch_acc - pp_acc) < 0.01, "the two frameworks should agree"
    assert pp_acc > (0.5 if FAST else 0.85)


if __name__ == "__main__":
    main()
