"""minimize(), AskTell and OptimizerConfig: results, bit-exact resume, and bad input."""
import pickle

import numpy as np
import pytest

import polyprobe


def sphere(x):
    return float(np.sum((x - 0.5) ** 2))


def test_minimize_smooth_function_with_recommended_config():
    res = polyprobe.minimize(sphere, np.zeros(4), 400, polyprobe.recommended_minimize_config(4))
    assert res.evaluations <= 400
    assert res.f < 1e-3
    np.testing.assert_allclose(res.x, 0.5, atol=0.05)


def test_minimize_accepts_a_dict_config_and_lists():
    res = polyprobe.minimize(sphere, [0.0, 0.0], 60, {"particle_dim": 2, "seed": 3})
    assert res.f <= sphere(np.zeros(2))
    assert res.x.shape == (2,)


def test_minimize_propagates_the_callables_exception():
    def f(x):
        raise KeyError("from f")

    with pytest.raises(KeyError, match="from f"):
        polyprobe.minimize(f, np.zeros(2), 10)


def test_minimize_nan_is_a_value_error_unless_allowed():
    with pytest.raises(ValueError, match="allow_nonfinite"):
        polyprobe.minimize(lambda x: float("nan"), np.zeros(2), 10)
    calls = []

    def f(x):
        calls.append(1)
        # (the first point stays finite: the core's minimize keeps a NaN x0 as its best)
        return float("nan") if len(calls) % 2 == 0 else sphere(x)

    res = polyprobe.minimize(f, np.zeros(2), 30, allow_nonfinite=True)
    assert np.isfinite(res.f)


def test_minimize_bad_arguments():
    with pytest.raises(ValueError, match="budget"):
        polyprobe.minimize(sphere, np.zeros(2), 0)
    with pytest.raises(ValueError, match="vector"):
        polyprobe.minimize(sphere, np.zeros((2, 2)), 10)
    with pytest.raises(ValueError, match="not a number"):
        polyprobe.minimize(lambda x: "no", np.zeros(2), 10)


def test_config_options_and_errors():
    c = polyprobe.OptimizerConfig(particle_dim=4, solver="softmax", radius_model="adaptive")
    assert c.particle_dim == 4 and c.solver == "softmax" and c.radius_model == "adaptive"
    assert c == polyprobe.OptimizerConfig(**c.to_dict())
    assert pickle.loads(pickle.dumps(c)) == c
    assert "solver='softmax'" in repr(c)
    with pytest.raises(ValueError, match="unknown optimizer option 'partcle_dim'"):
        polyprobe.OptimizerConfig(partcle_dim=3)
    with pytest.raises(ValueError, match="unknown"):
        polyprobe.OptimizerConfig(solver="magic")
    with pytest.raises(ValueError, match="must be an int"):
        polyprobe.OptimizerConfig(particle_dim=2.5)
    with pytest.raises(ValueError):
        polyprobe.OptimizerConfig(step_radius=-1.0).validate()
    assert polyprobe.OptimizerConfig(subspace_rotation_interval=5).subspace_rotation_interval == 5
    with pytest.raises(ValueError, match="subspace_rotation_interval must be 0"):
        polyprobe.OptimizerConfig(subspace_rotation_interval=-1).validate()
    with pytest.raises(ValueError, match="unknown optimizer option"):
        polyprobe.AskTell(2, {"nope": 1})
    with pytest.raises(ValueError):
        polyprobe.AskTell(2, "softmax")
    rec = polyprobe.recommended_minimize_config(10)
    assert rec.particle_dim == 10 and rec.metric == "bfgs"
    assert set(polyprobe.OptimizerConfig.options()) == set(c.to_dict())


def test_asktell_vectorised_sphere_converges():
    x0 = np.random.default_rng(1).normal(size=(50, 2)) * 3
    opt = polyprobe.AskTell(x0, {"solver": "softmax"})
    first = None
    for _ in range(60):
        X = opt.ask()
        assert X.ndim == 2 and X.shape[1] == 2
        losses = np.sum((X - 0.5) ** 2, axis=1)
        first = losses.mean() if first is None else first
        info = opt.tell(losses)
    assert info["step"] == 59
    assert opt.best_loss < 1e-2
    assert opt.evaluations > 0
    assert opt.particles.shape == (50, 2)


def run_steps(opt, steps):
    asked = []
    for _ in range(steps):
        X = opt.ask()
        asked.append(X.copy())
        opt.tell(np.abs(X - 0.3).sum(axis=1) + np.sin(7 * X[:, 0]))
    return asked


@pytest.mark.parametrize("config", [{}, {"radius_model": "trust_region"}, {"momentum": True}])
def test_asktell_state_dict_resumes_bit_for_bit(config):
    x0 = np.random.default_rng(2).normal(size=(20, 3))
    a = polyprobe.AskTell(x0, config)
    run_steps(a, 5)
    state = pickle.loads(pickle.dumps(a.state_dict()))
    expected = run_steps(a, 6)
    b = polyprobe.AskTell.from_state_dict(state)
    got = run_steps(b, 6)
    for e, g in zip(expected, got):
        assert np.array_equal(e, g)  # bit-exact, not approximately
    assert np.array_equal(a.particles, b.particles)
    assert a.best_loss == b.best_loss


def test_asktell_resume_with_a_pending_ask():
    a = polyprobe.AskTell(np.zeros((4, 2)), {"seed": 5})
    run_steps(a, 2)
    pending = a.ask()
    b = polyprobe.AskTell.from_state_dict(a.state_dict())
    assert np.array_equal(b.ask(), pending)


def test_asktell_bad_input():
    opt = polyprobe.AskTell(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="without a pending ask"):
        opt.tell(np.zeros(9))
    X = opt.ask()
    with pytest.raises(ValueError, match="losses for"):
        opt.tell(np.zeros(len(X) + 1))
    with pytest.raises(ValueError, match="vector"):
        opt.tell(np.zeros((len(X), 2)))
    bad = np.zeros(len(X))
    bad[2] = np.nan
    with pytest.raises(ValueError, match="non-finite value .* at index 2"):
        opt.tell(bad)
    opt.tell(bad, allow_nonfinite=True)  # scored as a failed evaluation
    with pytest.raises(ValueError, match="array of numbers"):
        opt.tell(object())
    with pytest.raises(ValueError, match="another configuration"):
        polyprobe.AskTell(np.zeros((3, 2)), {"seed": 9}).load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="particles"):
        polyprobe.AskTell(np.zeros((4, 2))).load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="dimensions"):
        polyprobe.AskTell(np.zeros((2, 2, 2)))
    with pytest.raises(ValueError, match="positive"):
        polyprobe.AskTell(0)
    with pytest.raises(ValueError, match=r"AskTell: dim 1000000000000 needs at least .* GB"):
        polyprobe.AskTell(10**12)
    with pytest.raises(ValueError, match="not an AskTell state_dict"):
        polyprobe.AskTell.from_state_dict({"foo": 1})
    damaged = opt.state_dict()
    del damaged["state"]
    with pytest.raises(ValueError, match="has no 'state'"):
        polyprobe.AskTell.from_state_dict(damaged)
    with pytest.raises(ValueError, match="has no 'shape'"):
        polyprobe.AskTell.from_state_dict({"format": "polyprobe.AskTell"})


def test_asktell_accepts_float32_and_torch_losses():
    opt = polyprobe.AskTell(3)
    X = opt.ask()
    opt.tell(np.sum(X ** 2, axis=1).astype(np.float32))
    torch = pytest.importorskip("torch", reason="python3-torch is not installed")
    X = torch.from_numpy(opt.ask())
    opt.tell((X ** 2).sum(dim=1))
