"""Model.to_torch() for every built-in layer kind: the PyTorch modules of polyprobe.torch
compute polyprobe's own forward (float32, within 1e-5 relative to max(|expected|, 1)), and
Model.from_torch() takes them back with the same model file and weights."""
import numpy as np
import pytest

import polyprobe

torch = pytest.importorskip("torch", reason="python3-torch is not installed (Debian: python3-torch)")
import polyprobe.torch as ppt  # noqa: E402


def lin(out, **attrs):
    return dict({"kind": "linear", "out_features": out}, **attrs)


# name -> (one sample's shape, layers, parameter scale): every built-in kind, and each of its
# variants (transforms, reset modes, causal masks, missing biases).
CASES = {
    "linear": ([12], [lin(5)], 1.0),
    "linear_positions_no_bias": ([3, 6], [lin(4, bias=False)], 1.0),
    "linear_sign": ([12], [lin(5, weight_transform="sign", bias_transform="sign")], 1.0),
    "linear_int8": ([12], [lin(5, weight_transform="int8", bias_transform="int8",
                               quant_step=1 / 64)], 1.0),
    "linear_int4": ([12], [lin(5, weight_transform="int4", bias_transform="int4",
                               quant_step=0.1)], 1.0),
    "linear_int4_positions": ([3, 6], [lin(4, weight_transform="int4", quant_step=0.05)], 1.0),
    "relu": ([10], [lin(8), {"kind": "relu"}], 1.0),
    "tanh": ([10], [lin(8), {"kind": "tanh"}], 1.0),
    "sign": ([10], [lin(8), {"kind": "sign"}], 1.0),
    "identity": ([10], [lin(8), {"kind": "identity"}], 1.0),
    "gelu": ([10], [lin(8), {"kind": "gelu"}], 1.0),
    "gelu_tanh": ([10], [lin(8), {"kind": "gelu", "approximate": "tanh"}], 1.0),
    "staircase": ([10], [lin(8), {"kind": "staircase", "step": 0.25}], 1.0),
    "layer_norm": ([5, 8], [{"kind": "layer_norm"}], 1.0),
    "layer_norm_plane_no_affine": ([5, 8], [{"kind": "layer_norm", "normalized_dims": 2,
                                            "elementwise_affine": False, "eps": 1e-3}], 1.0),
    "layer_norm_no_bias": ([5, 8], [{"kind": "layer_norm", "bias": False}], 1.0),
    "conv1d": ([3, 20], [{"kind": "conv1d", "out_channels": 4, "kernel_size": 3, "stride": 2,
                          "padding": 1, "dilation": 2}], 1.0),
    "conv1d_depthwise": ([3, 16], [{"kind": "conv1d", "out_channels": 6, "kernel_size": 5,
                                    "padding": 2, "groups": 3, "bias": False}], 1.0),
    "conv2d": ([2, 9, 9], [{"kind": "conv2d", "out_channels": 4, "kernel_size": [3, 2],
                            "stride": [2, 1], "padding": [1, 0], "dilation": [1, 2]}], 1.0),
    "max_pool1d": ([3, 11], [{"kind": "max_pool1d", "kernel_size": 3, "stride": 2,
                              "padding": 1}], 1.0),
    "avg_pool1d": ([3, 11], [{"kind": "avg_pool1d", "kernel_size": 2}], 1.0),
    "max_pool2d": ([2, 8, 8], [{"kind": "max_pool2d", "kernel_size": 2}], 1.0),
    "avg_pool2d": ([2, 9, 9], [{"kind": "avg_pool2d", "kernel_size": 3, "stride": 2,
                                "padding": 1}], 1.0),
    "flatten": ([2, 3, 4], [{"kind": "flatten"}, lin(3)], 1.0),
    "attention_softmax": ([6, 8], [{"kind": "self_attention", "num_heads": 2}], 1.0),
    "attention_argmax": ([6, 8], [{"kind": "self_attention", "num_heads": 2,
                                   "attention": "argmax"}], 1.0),
    "attention_argmax_causal_no_bias": ([7, 8], [{"kind": "self_attention", "num_heads": 2,
                                                  "attention": "argmax", "causal": True,
                                                  "bias": False}], 1.0),
    "attention_softmax_causal": ([6, 8], [{"kind": "self_attention", "num_heads": 4,
                                           "causal": True}], 1.0),
    "moe": ([10], [{"kind": "moe", "num_experts": 3, "out_features": 5}], 1.0),
    "moe_positions": ([4, 6], [{"kind": "moe", "num_experts": 4}], 1.0),
    "lif": ([12], [lin(8), {"kind": "lif", "steps": 8, "beta": 0.9, "threshold": 0.5}], 3.0),
    "lif_reset_zero": ([12], [lin(8), {"kind": "lif", "steps": 5, "beta": 0.8, "reset": "zero",
                                       "threshold": 0.3}], 3.0),
    "cheri_block": ([16, 8], [{"kind": "cheri_block", "dilation": 2, "expansion": 2}], 1.0),
}


def make(name, seed=0):
    shape, layers, scale = CASES[name]
    m = polyprobe.Model({"input_shape": shape, "dtype": "float32", "layers": layers}, seed=seed)
    rng = np.random.default_rng(seed)
    # Wider than PyTorch's initialisation, so quantisers use many levels, ReLUs and spikes
    # both fire and stay silent, and argmaxes pick different keys.
    m.parameters[:] = scale * rng.uniform(-1, 1, m.num_parameters)
    x = rng.standard_normal((6, *shape)).astype(np.float32)
    return m, x


def assert_same(actual, expected):
    scale = max(float(np.max(np.abs(expected))), 1.0)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=1e-5 * scale)


def test_every_builtin_kind_has_a_case():
    kinds = {layer["kind"] for _, layers, _ in CASES.values() for layer in layers}
    builtin = {"linear", "relu", "tanh", "sign", "identity", "gelu", "staircase", "layer_norm",
               "conv1d", "conv2d", "max_pool1d", "max_pool2d", "avg_pool1d", "avg_pool2d",
               "flatten", "self_attention", "moe", "lif", "cheri_block"}
    assert builtin <= kinds, f"no export case for {sorted(builtin - kinds)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_to_torch_computes_polyprobe_forward(name):
    m, x = make(name)
    net = m.to_torch()
    assert next(iter(net.parameters()), torch.zeros(1)).dtype == torch.float32
    with torch.no_grad():
        got = net(torch.from_numpy(x)).numpy()
    expected = m.forward(x, "float32").reshape(got.shape)
    assert_same(got, expected)


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_to_torch_and_back(name):
    m, x = make(name, seed=1)
    back = polyprobe.Model.from_torch(m.to_torch(), input_shape=m.input_shape)
    assert back.spec["layers"] == m.spec["layers"]
    np.testing.assert_array_equal(back.parameters, m.parameters.astype(np.float32))
    np.testing.assert_array_equal(back.forward(x, "float32"), m.forward(x, "float32"))


def test_float64_models_export_in_float64():
    m = polyprobe.Model({"input_shape": [6], "dtype": "float64",
                         "layers": [lin(4, weight_transform="int4", quant_step=0.2),
                                    {"kind": "lif", "steps": 4}]}, seed=3)
    net = m.to_torch()
    assert net[0].weight.dtype == torch.float64
    x = np.random.default_rng(3).standard_normal((5, 6))
    with torch.no_grad():
        np.testing.assert_allclose(net(torch.from_numpy(x)).numpy(), m.forward(x), atol=1e-12)


def test_the_example_models_export(repo):
    for path in sorted((repo / "examples" / "models").glob("**/*.json")):
        m = polyprobe.load_model(path)
        x = np.random.default_rng(0).standard_normal((4, *m.input_shape)).astype(np.float32)
        with torch.no_grad():
            got = m.to_torch()(torch.from_numpy(x)).numpy()
        assert_same(got, m.forward(x, "float32"))


def test_quantise_levels():
    w = torch.tensor([-1.0, -0.26, -0.05, 0.0, 0.049, 0.051, 0.3, 2.0])
    assert ppt.quantise(w, "int4", 0.1).tolist() == pytest.approx(
        [-0.7, -0.3, -0.0, 0.0, 0.0, 0.1, 0.3, 0.7])
    assert ppt.quantise(w, "sign").tolist() == [-1, -1, -1, 0, 1, 1, 1, 1]
    assert ppt.quantise(w, "int8", 0.01)[-1].item() == pytest.approx(1.27)
    with pytest.raises(ValueError, match="int2"):
        ppt.quantise(w, "int2")


def test_bad_module_arguments_are_named():
    with pytest.raises(ValueError, match="transform 'int3'"):
        ppt.TransformedLinear(3, 2, weight_transform="int3")
    with pytest.raises(ValueError, match="quant_step"):
        ppt.TransformedLinear(3, 2, weight_transform="int8", quant_step=0)
    with pytest.raises(ValueError, match="reset"):
        ppt.LIF(reset="hard")
    with pytest.raises(ValueError, match="attention"):
        ppt.SelfAttention(8, 2, attention="sparse")


def test_a_torch_defined_hard_model_trains_in_polyprobe_form():
    torch.manual_seed(0)
    net = torch.nn.Sequential(ppt.TransformedLinear(8, 6, weight_transform="int4",
                                                    quant_step=0.1),
                              ppt.LIF(steps=4), ppt.HardMoE(6, 3, 4), torch.nn.Linear(4, 2))
    m = polyprobe.Model.from_torch(net)
    assert [layer["kind"] for layer in m.spec["layers"]] == ["linear", "lif", "moe", "linear"]
    x = torch.randn(9, 8)
    with torch.no_grad():
        assert_same(m.forward(x.numpy(), "float32"), net(x).numpy())


def test_a_kind_without_module_is_named():
    with pytest.raises(ValueError, match="layer 2 \\(my_plugin_kind\\)"):
        ppt._module(2, {"kind": "my_plugin_kind"}, [4], {})
