"""The examples in examples/python run (small and fast: POLYPROBE_EXAMPLES_FAST=1)."""
import os
import subprocess
import sys

import pytest


def run(repo, name):
    env = dict(os.environ, POLYPROBE_EXAMPLES_FAST="1")
    out = subprocess.run([sys.executable, str(repo / "examples" / "python" / name)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_asktell_simulator(repo):
    assert "best:" in run(repo, "asktell_simulator.py")


def test_train_torch_staircase_mlp(repo):
    pytest.importorskip("torch", reason="python3-torch is not installed")
    assert "PyTorch with the trained weights" in run(repo, "train_torch_staircase_mlp.py")


def test_compare_optuna(repo):
    pytest.importorskip("optuna", reason="python3-optuna is not installed")
    assert "optuna TPE" in run(repo, "compare_optuna.py")
