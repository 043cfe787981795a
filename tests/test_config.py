"""Bad configs end in one clear line naming the key, before any Ray work (checked through the real CLI)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from experiments.config import ConfigError, load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("override, expected", [
    ("experiment=nope", "Could not find 'experiment/nope'"),
    ("+experiment.colour=red", "experiment.colour: unknown key"),
    ("experiment.colour=red", "experiment.colour: unknown key"),
    ("pool.num_workers=0", "pool.num_workers: must be >= 1"),
    ("experiment.num_shards=many", "experiment.num_shards: expected an integer"),
    ("experiment.task=mars_rover", "experiment.task: unknown task 'mars_rover'"),
    ("experiment.policy=/no/such/policy.pt", "experiment.policy: no such policy file"),
    ("train.cpus_per_worker=0", "train.cpus_per_worker: must be > 0"),
])
def test_bad_values_name_the_key(override, expected):
    with pytest.raises(ConfigError, match=None) as err:
        load(["experiment=collect", override])
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_prints_one_line_and_no_traceback(tmp_path):
    env = {**os.environ, "RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "experiments.run", "experiment=collect", "pool.num_workers=-3",
                           f"output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "config error: pool.num_workers: must be >= 1, got -3"
    assert not any(tmp_path.iterdir()), "nothing may be created for an invalid config"


def test_unknown_experiment_lists_the_choices():
    with pytest.raises(ConfigError) as err:
        load(["experiment=lift_pretrian"])
    assert "available:" in str(err.value) and "collect" in str(err.value)
