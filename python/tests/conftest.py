"""The tests import the package from PYTHONPATH: <build>/python when ctest runs them, or
an installed copy (`pytest python/tests` after `cmake --install` or pip)."""
import os
import pathlib

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def repo() -> pathlib.Path:
    return REPO


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
