"""The Ray tests must run on one xdist worker (tests/conftest.py): the fault tests kill Ray
processes by scanning the machine, and a second worker's cluster would die with them."""

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.ray
def test_a_ray_test_carries_the_ray_group_under_loadgroup(request):
    if not getattr(request.config.option, "loadgroup", False):  # a plain run: check it under xdist
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "1"]
        done = subprocess.run(
            [*command, "--dist", "loadgroup", __file__],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parents[2],
        )
        assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]
        return
    # xdist names the group by a suffix on the node id; with pytest 9.2 and xdist 3.8.0 it did not
    # (constraints.txt), and the groups were silently ignored.
    assert request.node.nodeid.endswith("@ray"), request.node.nodeid
