"""Runs pytest and fails when it collected no tests (pytest's exit code 5), for ctest."""
import sys

import pytest

code = pytest.main(sys.argv[1:])
if code == 5:
    print("run_pytest: pytest collected no tests; that is a failure here", file=sys.stderr)
    code = 1
sys.exit(int(code))
