"""repeats=N repeat_seeds=true: each repeat trains with its own seed, so one command gives rows whose
time-to-target interval holds the seeds' variation (the report says 'seeds'), where plain repeats of
one seed hold timing noise only (the report says 'timing only')."""

from __future__ import annotations

import pytest

from trainer.cli import expand_repeats
from trainer.errors import ConfigError


def test_repeat_seeds_sweeps_the_seed_from_the_one_given_slowest_first():
    argv = ["-m", "amp=false,true", "repeats=3", "repeat_seeds=true", "seed=7"]
    assert expand_repeats(argv) == ["-m", "seed=7,8,9", "amp=false,true", "repeat_seeds=true"]
    # no seed given: from the schema's default; repeat_seeds=false: repeats of one seed, as before
    assert expand_repeats(["-m", "amp=false,true", "repeats=2", "repeat_seeds=true"])[1] == "seed=42,43"
    assert expand_repeats(["-m", "amp=false,true", "repeats=3", "repeat_seeds=false"])[1] == "repeat=range(3)"
    with pytest.raises(ConfigError, match="needs one integer seed to start from, not 'seed=1,2'"):
        expand_repeats(["-m", "amp=false,true", "repeats=3", "repeat_seeds=true", "seed=1,2"])
    # one repeat: nothing to sweep, the seed stays as given
    assert expand_repeats(["-m", "amp=false,true", "repeats=1", "repeat_seeds=true", "seed=7"]) == [
        "-m",
        "amp=false,true",
        "repeat_seeds=true",
        "seed=7",
    ]
