#!/usr/bin/python3
"""Writes the PyTorch parity fixtures of polyprobe's layer, model and loss tests.

For every case it builds the model twice, from one description: as a polyprobe model file
(tests/fixtures/<case>.json) and as a torch.nn.Sequential with the same parameter names, draws
weights and inputs, and stores in tests/fixtures/<case>.safetensors the weights (float32, the
names PyTorch gives them: "0.weight", ...), the input batch ("input", float32) and PyTorch's
output ("output", computed in float64 from the float32 weights and inputs). Loss cases also
store "labels" or "targets" and the objective ("objective": mean loss + l2 * |theta|^2).
Cases whose output changes between float32 and float64 evaluation (an input too close to a
step of sign, staircase, argmax or a spike threshold) are redrawn, so the fixtures test
arithmetic, not rounding luck at a discontinuity.

Run it with Debian's Python and PyTorch (not a virtual environment's python3):
    apt-get install -y python3-torch
    /usr/bin/python3 tools/make_fixtures.py            # rewrites tests/fixtures/
The output is deterministic for a given PyTorch version; the fixtures are committed, so the
tests need no PyTorch.
"""
import json
import os
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
BATCH = 4


# ---------------------------------------------------------------------------------------------
# Modules polyprobe has and torch.nn does not (same parameter names as polyprobe's layers).
class Sign(nn.Module):
    def forward(self, x):
        return torch.sign(x)


class Staircase(nn.Module):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def forward(self, x):
        return self.step * torch.floor(x / self.step)


class TransformedLinear(nn.Linear):
    """nn.Linear with an elementwise weight transform: sign or int8 fake quantisation."""

    def __init__(self, n_in, n_out, transform, step=1.0 / 64.0):
        super().__init__(n_in, n_out)
        self.transform, self.step = transform, step

    def q(self, w):
        if self.transform == "sign":
            return torch.sign(w)
        return torch.clamp(torch.round(w / self.step), -127, 127) * self.step

    def forward(self, x):
        return F.linear(x, self.q(self.weight), self.bias)


class SelfAttention(nn.MultiheadAttention):
    """nn.MultiheadAttention called on (x, x, x); 'argmax' makes the attention weights one-hot;
    causal masks the keys after each query (attn_mask True above the diagonal)."""

    def __init__(self, embed, heads, attention="softmax", causal=False):
        super().__init__(embed, heads, batch_first=True)
        self.heads, self.attention, self.causal = heads, attention, causal

    def forward(self, x):
        length = x.shape[1]
        mask = (torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
                if self.causal else None)
        if self.attention == "softmax":
            return super().forward(x, x, x, need_weights=False, attn_mask=mask)[0]
        b, length, e = x.shape
        d = e // self.heads
        qkv = F.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.split(e, dim=-1)
        split = lambda t: t.reshape(b, length, self.heads, d).transpose(1, 2)
        q, k, v = split(q), split(k), split(v)
        scores = (q / d ** 0.5) @ k.transpose(-1, -2)
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        weights = F.one_hot(scores.argmax(-1), length).to(x.dtype)
        mixed = (weights @ v).transpose(1, 2).reshape(b, length, e)
        return self.out_proj(mixed)


class HardMoE(nn.Module):
    def __init__(self, n_in, experts, n_out):
        super().__init__()
        self.router = nn.Linear(n_in, experts)
        self.experts = nn.ModuleList([nn.Linear(n_in, n_out) for _ in range(experts)])

    def forward(self, x):
        choice = self.router(x).argmax(-1, keepdim=True)
        every = torch.stack([e(x) for e in self.experts], dim=-2)  # [..., E, out]
        index = choice.unsqueeze(-1).expand(*choice.shape[:-1], 1, every.shape[-1])
        return every.gather(-2, index).squeeze(-2)


class LIF(nn.Module):
    def __init__(self, steps=8, beta=0.9, threshold=1.0, reset="subtract"):
        super().__init__()
        self.steps, self.beta, self.threshold, self.reset = steps, beta, threshold, reset

    def forward(self, current):
        v = torch.zeros_like(current)
        spikes = torch.zeros_like(current)
        for _ in range(self.steps):
            v = self.beta * v + current
            s = (v >= self.threshold).to(current.dtype)
            spikes = spikes + s
            v = v * (1 - s) if self.reset == "zero" else v - s * self.threshold
        return spikes / self.steps


class CheriBlock(nn.Module):
    """docs/design.md section 6, on [N, L, C] (channels last)."""

    def __init__(self, channels, dilation=1, expansion=2):
        super().__init__()
        self.dilation = dilation
        self.conv_weight = nn.Parameter(torch.empty(3, channels).uniform_(-0.5, 0.5))
        self.fc1 = nn.Linear(channels, expansion * channels, bias=False)
        self.fc2 = nn.Linear(expansion * channels, channels, bias=False)

    def forward(self, x):
        d, length = self.dilation, x.shape[1]
        h = self.conv_weight[1] * x
        if d < length:
            h[:, d:] = h[:, d:] + self.conv_weight[0] * x[:, :-d]
            h[:, :-d] = h[:, :-d] + self.conv_weight[2] * x[:, d:]
        n = F.layer_norm(h, h.shape[1:], eps=1e-3)
        return x + 0.15 * self.fc2(F.gelu(self.fc1(n), approximate="tanh"))


class Flatten(nn.Flatten):
    pass


# ---------------------------------------------------------------------------------------------
# Cases: name -> (input shape, polyprobe layers, torch modules, loss or None).
def cases():
    c = {}

    def add(name, shape, layers, modules, loss=None):
        c[name] = (shape, layers, modules, loss)

    add("linear", [12], [{"kind": "linear", "out_features": 5}], lambda: [nn.Linear(12, 5)])
    add("linear_no_bias_positions", [3, 6], [{"kind": "linear", "out_features": 4, "bias": False}],
        lambda: [nn.Linear(6, 4, bias=False)])
    add("linear_sign", [12], [{"kind": "linear", "out_features": 5, "weight_transform": "sign"}],
        lambda: [TransformedLinear(12, 5, "sign")])
    add("linear_int8", [12], [{"kind": "linear", "out_features": 5, "weight_transform": "int8",
                                "quant_step": 1.0 / 64.0}],
        lambda: [TransformedLinear(12, 5, "int8")])
    for kind, module in [("relu", nn.ReLU), ("tanh", nn.Tanh), ("sign", Sign),
                         ("identity", nn.Identity)]:
        add("act_" + kind, [10], [{"kind": "linear", "out_features": 8}, {"kind": kind}],
            lambda module=module: [nn.Linear(10, 8), module()])
    add("act_gelu", [10], [{"kind": "linear", "out_features": 8}, {"kind": "gelu"}],
        lambda: [nn.Linear(10, 8), nn.GELU()])
    add("act_gelu_tanh", [10], [{"kind": "linear", "out_features": 8},
                                {"kind": "gelu", "approximate": "tanh"}],
        lambda: [nn.Linear(10, 8), nn.GELU(approximate="tanh")])
    add("act_staircase", [10], [{"kind": "linear", "out_features": 8},
                                {"kind": "staircase", "step": 0.25}],
        lambda: [nn.Linear(10, 8), Staircase(0.25)])
    add("layer_norm", [5, 8], [{"kind": "layer_norm"}], lambda: [nn.LayerNorm(8)])
    add("layer_norm_plane", [5, 8], [{"kind": "layer_norm", "normalized_dims": 2,
                                      "elementwise_affine": False, "eps": 1e-3}],
        lambda: [nn.LayerNorm([5, 8], elementwise_affine=False, eps=1e-3)])
    add("conv1d", [3, 20], [{"kind": "conv1d", "out_channels": 4, "kernel_size": 3, "stride": 2,
                             "padding": 1, "dilation": 2}],
        lambda: [nn.Conv1d(3, 4, 3, stride=2, padding=1, dilation=2)])
    add("conv1d_depthwise", [3, 16], [{"kind": "conv1d", "out_channels": 6, "kernel_size": 5,
                                       "padding": 2, "groups": 3, "bias": False}],
        lambda: [nn.Conv1d(3, 6, 5, padding=2, groups=3, bias=False)])
    add("conv2d", [2, 9, 9], [{"kind": "conv2d", "out_channels": 4, "kernel_size": [3, 2],
                               "stride": [2, 1], "padding": [1, 0], "dilation": [1, 2]}],
        lambda: [nn.Conv2d(2, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2))])
    add("conv2d_depthwise", [4, 7, 7], [{"kind": "conv2d", "out_channels": 4, "kernel_size": 3,
                                         "padding": 2, "dilation": 2, "groups": 4}],
        lambda: [nn.Conv2d(4, 4, 3, padding=2, dilation=2, groups=4)])
    add("max_pool1d", [3, 11], [{"kind": "max_pool1d", "kernel_size": 3, "stride": 2,
                                 "padding": 1}], lambda: [nn.MaxPool1d(3, 2, 1)])
    add("avg_pool1d", [3, 11], [{"kind": "avg_pool1d", "kernel_size": 2}],
        lambda: [nn.AvgPool1d(2)])
    add("max_pool2d", [2, 8, 8], [{"kind": "max_pool2d", "kernel_size": 2}],
        lambda: [nn.MaxPool2d(2)])
    add("avg_pool2d", [2, 9, 9], [{"kind": "avg_pool2d", "kernel_size": 3, "stride": 2,
                                   "padding": 1}], lambda: [nn.AvgPool2d(3, 2, 1)])
    add("flatten", [2, 3, 4], [{"kind": "flatten"}, {"kind": "linear", "out_features": 3}],
        lambda: [Flatten(), nn.Linear(24, 3)])
    add("attention_softmax", [6, 8], [{"kind": "self_attention", "num_heads": 2}],
        lambda: [SelfAttention(8, 2)])
    add("attention_argmax", [6, 8], [{"kind": "self_attention", "num_heads": 2,
                                      "attention": "argmax"}],
        lambda: [SelfAttention(8, 2, "argmax")])
    # Named to sort after the older cases, whose seeds (their index in sorted order) stay.
    add("self_attention_causal_softmax", [6, 8],
        [{"kind": "self_attention", "num_heads": 2, "causal": True}],
        lambda: [SelfAttention(8, 2, causal=True)])
    add("self_attention_causal_argmax", [7, 8],
        [{"kind": "self_attention", "num_heads": 2, "attention": "argmax", "causal": True}],
        lambda: [SelfAttention(8, 2, "argmax", causal=True)])
    add("moe", [10], [{"kind": "moe", "num_experts": 3, "out_features": 5}],
        lambda: [HardMoE(10, 3, 5)])
    add("moe_positions", [4, 6], [{"kind": "moe", "num_experts": 4}], lambda: [HardMoE(6, 4, 6)])
    add("lif", [12], [{"kind": "linear", "out_features": 8},
                      {"kind": "lif", "steps": 8, "beta": 0.9, "threshold": 0.5}],
        lambda: [nn.Linear(12, 8), LIF(8, 0.9, 0.5)])
    add("lif_reset_zero", [12], [{"kind": "linear", "out_features": 8},
                                 {"kind": "lif", "steps": 5, "beta": 0.8, "reset": "zero",
                                  "threshold": 0.3}],
        lambda: [nn.Linear(12, 8), LIF(5, 0.8, 0.3, "zero")])
    add("cheri_block", [16, 8], [{"kind": "cheri_block", "dilation": 2, "expansion": 2}],
        lambda: [CheriBlock(8, 2, 2)])
    # Whole models.
    add("model_mlp", [64], [{"kind": "linear", "out_features": 32}, {"kind": "relu"},
                            {"kind": "linear", "out_features": 10}],
        lambda: [nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10)])
    add("model_cnn", [1, 8, 8], [{"kind": "conv2d", "out_channels": 4, "kernel_size": 3,
                                  "padding": 1}, {"kind": "relu"},
                                 {"kind": "max_pool2d", "kernel_size": 2}, {"kind": "flatten"},
                                 {"kind": "linear", "out_features": 10}],
        lambda: [nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), Flatten(),
                 nn.Linear(64, 10)])
    add("model_transformer", [8, 8], [{"kind": "self_attention", "num_heads": 2},
                                      {"kind": "layer_norm"}, {"kind": "cheri_block"},
                                      {"kind": "flatten"}, {"kind": "linear", "out_features": 10}],
        lambda: [SelfAttention(8, 2), nn.LayerNorm(8), CheriBlock(8), Flatten(),
                 nn.Linear(64, 10)])
    add("model_binary", [16], [{"kind": "linear", "out_features": 12, "weight_transform": "sign"},
                               {"kind": "sign"}, {"kind": "linear", "out_features": 3}],
        lambda: [TransformedLinear(16, 12, "sign"), Sign(), nn.Linear(12, 3)])
    # Losses, with l2 regularisation on a small linear model.
    for loss in ["cross_entropy", "mse", "hinge", "zero_one"]:
        add("loss_" + loss, [6], [{"kind": "linear", "out_features": 4}],
            lambda: [nn.Linear(6, 4)], loss)
    return c


def torch_loss(name, out, labels, targets):
    if name == "cross_entropy":
        return F.cross_entropy(out, labels)
    if name == "mse":
        return F.mse_loss(out, targets)
    if name == "hinge":
        return F.multi_margin_loss(out, labels)
    return (out.argmax(-1) != labels).to(out.dtype).mean()


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        dtype = {torch.float32: "F32", torch.float64: "F64"}[t.dtype]
        data = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - (len(text) + 8) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text.encode())
        for blob in blobs:
            f.write(blob)


def make_case(name, shape, layers, modules, loss, seed):
    for attempt in range(50):
        torch.manual_seed(seed * 1000 + attempt)
        model = nn.Sequential(*modules()).float()
        x = torch.randn(BATCH, *shape)
        labels = torch.randint(0, 4, (BATCH,))
        targets = torch.randn(BATCH, 4)
        with torch.no_grad():
            out32 = model(x)
            model64 = nn.Sequential(*modules())
            model64.load_state_dict(model.state_dict())
            model64 = model64.double()
            out64 = model64(x.double())
        scale = out64.abs().clamp(min=1.0)
        if ((out32.double() - out64).abs() / scale).max() < 1e-6:
            break
    else:
        sys.exit(f"{name}: no draw was free of near-discontinuities")
    tensors = {k: v.float() for k, v in model.state_dict().items()}
    tensors["input"] = x
    tensors["output"] = out64.reshape(BATCH, -1)
    doc = {"polyprobe_model": 1, "input_shape": shape, "dtype": "float32", "layers": layers}
    if loss:
        l2 = 0.01
        with torch.no_grad():
            theta = sum((p.double() ** 2).sum() for p in model64.parameters())
            value = torch_loss(loss, out64, labels, targets.double()) + l2 * theta
        if loss == "mse":
            tensors["targets"] = targets
        else:
            tensors["labels"] = labels.float()
        tensors["objective"] = value.reshape(1)
        doc["loss"], doc["l2"] = loss, l2
    write_safetensors(os.path.join(OUT, name + ".safetensors"), tensors)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    for i, (name, (shape, layers, modules, loss)) in enumerate(sorted(cases().items())):
        make_case(name, shape, layers, modules, loss, i + 1)
    print(f"wrote {len(cases())} cases to {os.path.normpath(OUT)} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
