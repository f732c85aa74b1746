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


def test_train_labels_and_options_are_checked_as_the_cli_does(digits, tmp_path):
    x, y = digits["train"]
    x, y = x[:200], y[:200]
    floats = y.astype(np.float64)
    floats[7] = 2.5
    with pytest.raises(ValueError, match=r"training label at row 7 is 2\.5.*not a whole number"):
        polyprobe.train(mlp(), x, floats, progress=False)
    floats[7] = np.nan
    # Row 7 of the caller's array, not of the shuffled split.
    with pytest.raises(ValueError, match="training label at row 7 is NaN, not a class index"):
        polyprobe.train(mlp(), x, floats, progress=False)
    with pytest.raises(ValueError, match="validation label at row 3 is NaN"):
        bad = y[:50].astype(np.float64)
        bad[3] = np.nan
        polyprobe.train(mlp(), x, y, validation=(x[:50], bad), progress=False)
    # Whole-number floats are class indices.
    r = polyprobe.train(mlp(), x, y.astype(np.float64), epochs=1, progress=False)
    assert r.steps > 0
    with pytest.raises(ValueError, match="time_limit must be a number of seconds >= 0"):
        polyprobe.train(mlp(), x, y, time_limit=-1, progress=False)
    with pytest.raises(ValueError, match="schedule_clock='time' runs the schedule over time_limit"):
        polyprobe.train(mlp(), x, y, schedule_clock="time", progress=False)
    with pytest.raises(ValueError, match="schedule_clock must be 'steps' or 'time'"):
        polyprobe.train(mlp(), x, y, schedule_clock="wall", time_limit=5, progress=False)
    # Timed by the clock, the schedule is at least as far along as the steps say.
    timed = polyprobe.train(mlp(), x, y, epochs=1, schedule_clock="time", time_limit=60,
                            progress=False)
    steps = polyprobe.train(mlp(), x, y, epochs=1, progress=False)
    assert all(a["epsilon"] <= b["epsilon"] for a, b in zip(timed.metrics, steps.metrics))
    with pytest.raises(ValueError, match="seed must be >= 0"):
        polyprobe.train(mlp(), x, y, validation=(x, y), seed=-1, progress=False)
    with pytest.raises(ValueError, match="metrics needs a file name"):
        polyprobe.train(mlp(), x, y, validation=(x, y), metrics="", progress=False)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RuntimeError, match="a FIFO"):
        polyprobe.train(mlp(), x, y, validation=(x, y), metrics=str(fifo), progress=False)
    assert fifo.is_fifo()


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
    devices = polyprobe.devices()
    assert "cpu" in devices and "cuda" in devices, devices
    with pytest.raises(RuntimeError, match=r"unknown device 'nosuchaccel' \(known: cpu, cuda"):
        polyprobe.explain(mlp(), device="nosuchaccel")
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


def test_plugin_search_warns_of_relative_entries(tmp_path):
    code = "import warnings, polyprobe\nwith warnings.catch_warnings(record=True) as w:\n" \
           "    warnings.simplefilter('always')\n    polyprobe.plugins()\n" \
           "print([str(x.message) for x in w])"
    env = dict(os.environ, POLYPROBE_PLUGIN_PATH=".:plugins")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "POLYPROBE_PLUGIN_PATH entry '.' is a relative path" in r.stdout
    assert "entry 'plugins' is a relative path" in r.stdout
