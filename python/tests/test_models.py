"""Models: files, safetensors, forward, and round trips with PyTorch."""
import json
import os

import numpy as np
import pytest

import polyprobe

MLP = {"input_shape": [8], "layers": [{"kind": "linear", "out_features": 5}, {"kind": "relu"},
                                      {"kind": "linear", "out_features": 3}]}


def test_model_from_spec_forward_and_parameters_view():
    m = polyprobe.Model(MLP, seed=1)
    assert m.num_parameters == 8 * 5 + 5 + 5 * 3 + 3
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    y = m(x)
    assert y.shape == (4, 3) and y.dtype == np.float32
    p = m.parameters
    p[:] = 0  # a view: writes go to the model
    assert np.all(m(x) == 0)
    with pytest.raises(ValueError, match="model\\(x\\)"):
        m(np.zeros((4, 7)))
    assert "linear" in repr(m)


def test_model_files_and_safetensors_round_trip(tmp_path):
    m = polyprobe.Model(MLP, seed=2)
    m.save(tmp_path / "w.safetensors", metadata={"note": "test"})
    back = polyprobe.load_model(tmp_path / "w.safetensors")
    assert np.array_equal(np.float32(m.parameters), np.float32(back.parameters))
    tensors, meta = polyprobe.read_safetensors(tmp_path / "w.safetensors")
    assert meta["note"] == "test" and tensors["0.weight"].shape == (5, 8)
    polyprobe.write_safetensors(tmp_path / "x.safetensors", m.state_dict(), dtype="F64")
    again = polyprobe.load_model(tmp_path / "w.json", weights=tmp_path / "x.safetensors")
    assert np.array_equal(again.parameters, m.parameters)


def test_model_bad_input(tmp_path):
    with pytest.raises(ValueError, match="unknown layer kind|known kinds|nope"):
        polyprobe.Model({"input_shape": [4], "layers": [{"kind": "nope"}]})
    (tmp_path / "bad.json").write_text('{"input_shape": [4], "layers": [')
    with pytest.raises(ValueError, match="bad.json"):
        polyprobe.load_model(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        polyprobe.load_model(tmp_path / "missing.json")
    m = polyprobe.Model(MLP)
    sd = m.state_dict()
    sd["0.weight"] = np.zeros((2, 2))
    with pytest.raises(ValueError, match="0.weight"):
        m.load_state_dict(sd)
    sd = m.state_dict()
    sd["0.bias"][1] = np.nan
    with pytest.raises(ValueError):
        m.load_state_dict(sd)


def test_examples_model_files_load(repo):
    for name in ("staircase_mlp.json", "sign_mlp.json", "binary_mlp.json"):
        m = polyprobe.load_model(repo / "examples" / "models" / name)
        assert m(np.zeros((2, 64))).shape == (2, 10)


torch = pytest.importorskip("torch", reason="python3-torch is not installed (Debian: python3-torch)")
from torch import nn  # noqa: E402

import polyprobe.torch as ppt  # noqa: E402


def test_from_torch_matches_torch_forward():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 6), nn.Tanh(), nn.Linear(6, 6), ppt.Staircase(0.5),
                        nn.Linear(6, 4), ppt.Sign(), nn.Linear(4, 3))
    m = polyprobe.Model.from_torch(net)
    x = torch.randn(16, 8, dtype=torch.float64)
    expected = net.double()(x).detach().numpy()
    np.testing.assert_allclose(m.forward(x.numpy(), "float64"), expected, atol=1e-9)


def test_torch_round_trip_conv():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(3 * 4 * 4, 10))
    m = polyprobe.Model.from_torch(net, input_shape=[1, 8, 8])
    back = m.to_torch()
    x = torch.randn(5, 1, 8, 8)
    np.testing.assert_allclose(back(x).detach().numpy(), net(x).detach().numpy(), atol=1e-5)
    np.testing.assert_allclose(m(x), net(x).detach().numpy(), atol=1e-4)
    for k, v in net.state_dict().items():
        assert torch.equal(back.state_dict()[k], v)


def test_weights_move_back_to_torch_after_changes():
    net = nn.Sequential(nn.Linear(4, 3))
    m = polyprobe.Model.from_torch(net)
    m.parameters[:] = np.arange(m.num_parameters, dtype=np.float64)
    back = m.to_torch()
    assert back[0].weight[1, 2].item() == 6.0


def test_from_torch_names_the_unsupported_module():
    with pytest.raises(ValueError, match="layer 1 \\(Sigmoid\\) is not supported"):
        polyprobe.Model.from_torch(nn.Sequential(nn.Linear(3, 3), nn.Sigmoid()))
    with pytest.raises(ValueError, match="nn.Sequential"):
        polyprobe.Model.from_torch(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="input_shape"):
        polyprobe.Model.from_torch(nn.Sequential(nn.ReLU()))


def test_to_torch_exports_what_nn_lacks(repo):
    m = polyprobe.load_model(repo / "examples" / "models" / "binary_mlp.json")
    net = m.to_torch()
    assert isinstance(net[0], ppt.TransformedLinear) and isinstance(net[1], ppt.Sign)


def test_save_refuses_weights_that_cannot_be_loaded_back(tmp_path):
    m = polyprobe.Model({"input_shape": [3], "layers": [{"kind": "linear", "out_features": 2}]})
    m.parameters[1] = np.nan
    with pytest.raises(ValueError, match="parameter 1 is nan; weights that are not finite"):
        m.save(tmp_path / "w.safetensors")
    assert not (tmp_path / "w.safetensors").exists()
    m.parameters[1] = 0.0
    fifo = tmp_path / "f.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(RuntimeError, match="it is a FIFO .*polyprobe writes only regular files"):
        m.save(fifo)
    assert fifo.is_fifo()
