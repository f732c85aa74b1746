"""train(), evaluate(), load_data(), plugins() and explain()."""
import os
import subprocess
import sys

import numpy as np
import pytest

import polyprobe


@pytest.fixture(scope="module")
def digits():
    return polyprobe.load_data("digits")


def mlp(seed=0):
    return polyprobe.Model({"input_shape": [64], "layers": [
        {"kind": "linear", "out_features": 16}, {"kind": "relu"},
        {"kind": "linear", "out_features": 10}]}, seed=seed)


def test_load_data_digits(digits):
    x, y = digits["train"]
    assert x.shape[1] == 64 and y.dtype == np.int64 and digits["num_classes"] == 10
    assert abs(float(x.mean())) < 0.1  # standardised


def test_train_restores_the_best_state_and_reports_metrics(digits):
    m = mlp()
    seen = []
    r = polyprobe.train(m, *digits["train"], validation=digits["validation"], epochs=2,
                        progress=seen.append)
    assert r.steps == len(r.metrics) == len(seen) > 0
    assert r.best_validation_accuracy > 0.5
    assert r.validations == 2 and len(r.validations_only()) == 2
    ev = polyprobe.evaluate(m, *digits["validation"])
    assert ev["accuracy"] == pytest.approx(r.best_validation_accuracy)
    assert r.evaluator


def test_train_is_silent_and_holds_out_validation_itself(digits, capsys):
    r = polyprobe.train(mlp(), *digits["train"], epochs=1, progress=False)
    assert r.validations == 1
    assert capsys.readouterr().err == ""


def test_train_bad_input(digits):
    x, y = digits["train"]
    with pytest.raises(ValueError, match="unknown option 'epoch'; did you mean 'epochs'"):
        polyprobe.train(mlp(), x, y, epoch=1)
    with pytest.raises(ValueError, match="inputs must be"):
        polyprobe.train(mlp(), x[:, :10], y, validation=(x, y), progress=False)
    with pytest.raises(ValueError, match="labels"):
        polyprobe.train(mlp(), x, y[:-1], validation=(x, y), progress=False)
    with pytest.raises(ValueError, match="not a class"):
        polyprobe.train(mlp(), x, y + 10, validation=(x, y), progress=False)
    with pytest.raises(ValueError, match="trust_region"):
        polyprobe.train(mlp(), x, y, validation=(x, y), radius_model="trust_region")
    with pytest.raises(ValueError, match="must be int"):
        polyprobe.train(mlp(), x, y, validation=(x, y), epochs="2")
    with pytest.raises(RuntimeError, match="no_such_plugin"):
        polyprobe.train(mlp(), x, y, validation=(x, y), epochs=1, backend="no_such_plugin",
                        progress=False)
    with pytest.raises(ValueError, match="unknown candidate dtype 'int8'"):
        polyprobe.train(mlp(), x, y, validation=(x, y), candidate_dtype="int8")
    # No cpu backend runs candidate_autocast: refused, never ignored.
    with pytest.raises(RuntimeError, match="no plugin can run candidate_autocast"):
        polyprobe.train(mlp(), x, y, validation=(x, y), epochs=1, candidate_dtype="bf16",
                        progress=False)


def test_train_progress_exception_propagates(digits):
    def boom(p):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        polyprobe.train(mlp(), *digits["train"], validation=digits["validation"], progress=boom)


def test_plugins_listed_and_explain():
    plugins = polyprobe.plugins()
    names = [p["name"] for p in plugins]
    assert "cpu_tbb" in names, (names, polyprobe.plugin_dirs())
    info = polyprobe.explain(mlp())
    assert info["selection"]["chosen"] in names + ["reference"]
    ref = polyprobe.explain(mlp(), backend="reference")
    assert ref["selection"]["chosen"] == "reference"
    with pytest.raises(RuntimeError, match="no_such_plugin"):
        polyprobe.explain(mlp(), backend="no_such_plugin")
    with pytest.raises(RuntimeError, match="already loaded"):
        polyprobe.set_plugin_dirs([])


def test_withhold_operations_in_a_fresh_process(tmp_path):
    """Plugins load once per process, so withholding is checked in fresh interpreters (run
    outside the source tree, whose python/polyprobe has no _core, so that PYTHONPATH's
    package is the one imported)."""
    def run(code):
        return subprocess.run([sys.executable, "-c", "import polyprobe\n" + code],
                              capture_output=True, text=True, timeout=120, env=dict(os.environ),
                              cwd=tmp_path)

    ok = run('polyprobe.withhold_operations(["factored_correction"])\n'
             'info = {p["name"]: p for p in polyprobe.plugins()}\n'
             'print(info["factored_subspace"]["available"], info["factored_subspace"]["reason"])')
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("True "), ok.stdout  # the subspace kind stays
    assert "operation factored_correction (cpu) not offered: withheld by the host" in ok.stdout
    typo = run('polyprobe.withhold_operations(["factored_corection"])\npolyprobe.plugins()')
    assert typo.returncode != 0
    assert "ValueError: withhold_operations: no loaded plugin offers 'factored_corection' " \
           "(offered: factored_correction, sdpa)" in typo.stderr, typo.stderr
    # In this process the plugins are loaded already.
    polyprobe.plugins()
    with pytest.raises(RuntimeError, match="already loaded"):
        polyprobe.withhold_operations(["sdpa"])
