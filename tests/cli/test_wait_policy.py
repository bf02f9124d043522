"""The command line lets torch's idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) unless the user
chose a policy, and sets it before torch starts its OpenMP runtime, which reads it once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SEEN_BY_TORCH = """
import os, sys
from surgery.cli.main import main
assert "torch" not in sys.modules, "torch was imported before the policy could be set"
try:
    main(["--help"])
except SystemExit:
    pass
import torch  # the OpenMP runtime starts here and reads the environment
print("POLICY=" + os.environ.get("OMP_WAIT_POLICY", ""))
"""


def _policy_seen(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    out = subprocess.run([sys.executable, "-c", SEEN_BY_TORCH], env=env, capture_output=True, text=True, check=True)
    return next(line for line in out.stdout.splitlines() if line.startswith("POLICY=")).removeprefix("POLICY=")


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE"), ("passive", "passive")])
def test_the_command_line_sets_a_passive_wait_policy_unless_the_user_chose(given, expected):
    assert _policy_seen(given) == expected
