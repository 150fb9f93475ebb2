"""Destructive mistakes: nothing a user owns is deleted or overwritten by any command of ours."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image


def _jpegs(root: Path, classes=("a", "b"), per_class=4) -> Path:
    for i, cls in enumerate(classes):
        (root / cls).mkdir(parents=True)
        for j in range(per_class):
            Image.new("RGB", (24, 24), (90 * i, 30 * j, 60)).save(root / cls / f"{j}.jpg")
    return root


def _pack(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer.pack", *args, "--size", "16"], capture_output=True, text=True, timeout=300
    )


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_pack_refuses_a_folder_holding_the_users_files(tmp_path):
    src = _jpegs(tmp_path / "src")
    important = tmp_path / "important"
    important.mkdir()
    (important / "thesis.tex").write_text("years of work")
    r = _pack(str(src), str(important))
    assert r.returncode == 2 and "already holds files" in r.stderr and "Traceback" not in r.stderr
    assert (important / "thesis.tex").read_text() == "years of work" and len(list(important.iterdir())) == 1
    assert not list(tmp_path.glob(".pack-*"))  # no temp dir left behind


def test_pack_refuses_to_overwrite_a_packed_dataset_a_file_or_a_folder_inside_src(tmp_path):
    src = _jpegs(tmp_path / "src")
    assert _pack(str(src), str(tmp_path / "packed")).returncode == 0
    before = _snapshot(tmp_path / "packed")
    r = _pack(str(src), str(tmp_path / "packed"))
    assert (
        r.returncode == 2 and "already holds a packed dataset" in r.stderr and _snapshot(tmp_path / "packed") == before
    )
    (tmp_path / "notes.txt").write_text("mine")
    r = _pack(str(src), str(tmp_path / "notes.txt"))
    assert r.returncode == 2 and "not a folder" in r.stderr and (tmp_path / "notes.txt").read_text() == "mine"
    src_before = _snapshot(src)
    for inside in (src, src / "packed"):
        r = _pack(str(src), str(inside))
        assert r.returncode == 2 and "SRC" in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(src) == src_before


def test_pack_into_an_empty_folder_works(tmp_path):
    src = _jpegs(tmp_path / "src")
    (tmp_path / "empty").mkdir()
    r = _pack(str(src), str(tmp_path / "empty"))
    assert r.returncode == 0, r.stderr
    assert {p.name for p in (tmp_path / "empty").iterdir()} == {"images.npy", "labels.npy", "meta.json"}


def test_pack_keeps_a_train_val_split(tmp_path, train):
    import json

    src = tmp_path / "src"
    _jpegs(src / "train", classes=("cat", "dog", "eel"), per_class=4)
    _jpegs(src / "val", classes=("dog", "eel"), per_class=2)  # a class missing from val keeps train's numbering
    r = _pack(str(src), str(tmp_path / "packed"))
    assert r.returncode == 0, r.stderr
    assert "train 12, val 4" in r.stdout
    train_meta = json.loads((tmp_path / "packed" / "train" / "meta.json").read_text())
    val_meta = json.loads((tmp_path / "packed" / "val" / "meta.json").read_text())
    assert train_meta["classes"] == val_meta["classes"] == ["cat", "dog", "eel"]  # not two classes "train" and "val"
    import numpy as np

    assert sorted(set(np.load(tmp_path / "packed" / "val" / "labels.npy").tolist())) == [1, 2]
    assert (
        tmp_path / "packed"
    ).stat().st_mode & 0o055 == 0o055  # readable by others, like any folder (not the temp dir's 0700)
    m, _ = train("data=packed", f"data.root={tmp_path / 'packed'}", "data.image_size=16", "data.batch_size=4")
    assert m["status"] == "ok" and m["epochs"][0]["samples"] == 12
    only_train = tmp_path / "only"
    _jpegs(only_train / "train", classes=("x", "y"), per_class=2)
    r = _pack(str(only_train), str(tmp_path / "packed-train"))
    assert r.returncode == 0 and "train 4" in r.stdout, r.stderr
    assert json.loads((tmp_path / "packed-train" / "train" / "meta.json").read_text())["classes"] == [
        "x",
        "y",
    ]  # not one class "train"


def test_pack_removes_only_its_own_stale_temp_dir(tmp_path):
    src = _jpegs(tmp_path / "src")
    stale, foreign = tmp_path / ".pack-stale", tmp_path / ".pack-not-ours"
    stale.mkdir()
    import socket

    (stale / ".trainer-pack-in-progress").write_text(
        f"{socket.gethostname()} 999999999"
    )  # a pack that was killed: its PID is gone
    elsewhere = tmp_path / ".pack-other-host"
    elsewhere.mkdir()
    (elsewhere / ".trainer-pack-in-progress").write_text("another-host 999999999")  # may still run there: kept
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not ours")
    assert _pack(str(src), str(tmp_path / "packed")).returncode == 0
    assert not stale.exists() and elsewhere.exists() and (foreign / "keep.txt").read_text() == "not ours"


def test_pack_names_an_undecodable_file_and_writes_nothing(tmp_path):
    src = _jpegs(tmp_path / "src")
    (src / "a" / "broken.jpg").write_bytes(b"\xff\xd8 not really")
    r = _pack(str(src), str(tmp_path / "packed"))
    assert r.returncode == 2 and "broken.jpg" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "packed").exists() and not list(tmp_path.glob(".pack-*"))


def test_a_finished_run_dir_is_resumed_never_trained_over(tmp_path):
    from conftest import TINY, run_cli

    run_dir = tmp_path / "run"
    assert run_cli(f"hydra.run.dir={run_dir}", *TINY, "checkpoint.enabled=true").returncode == 0
    before = _snapshot(run_dir)  # everything: metrics, checkpoints, .hydra/, logs
    r = run_cli(f"hydra.run.dir={run_dir}", *TINY, "checkpoint.enabled=true")
    assert (
        r.returncode == 2
        and "hydra.run.dir" in r.stderr
        and "ckpt_path=last" in r.stderr
        and "Traceback" not in r.stderr
    )
    assert _snapshot(run_dir) == before
    # a resume that stops before it trains (here: a checkpoint of another model) keeps the run's own
    # config files, which Hydra had rewritten with the failed attempt's, its metrics.json and checkpoints
    r = run_cli(f"hydra.run.dir={run_dir}", *TINY, "checkpoint.enabled=true", "ckpt_path=last", "model.width=32")
    assert r.returncode == 2 and "holds another model" in r.stderr, r.stderr[-2000:]
    after = _snapshot(run_dir)
    kept = [k for k in before if k.startswith((".hydra", "checkpoints")) or k == "metrics.json"]
    assert [k for k in kept if after.get(k) != before[k]] == []
    # a run killed mid-way (its journal says running): its record is not replaced by a failure either
    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "metrics.json").write_text(
        json.dumps({"schema": 1, "status": "running", "epochs": [{"epoch": 0, "time_s": 1.0}]})
    )
    before = _snapshot(killed)
    r = run_cli(f"hydra.run.dir={killed}", *TINY)
    assert r.returncode == 2 and "status running" in r.stderr and _snapshot(killed) == before


def test_a_launched_resume_that_stops_on_bad_input_after_it_trained_keeps_its_own_config(tmp_path):
    """Bad input found mid-epoch exits with 2, as a checkpoint that does not fit does: only the latter
    (nothing trained) gets the earlier config files back, also where the run trains in a process
    the job's own process started (here the allocator's relaunch; torchrun's ranks alike)."""
    from conftest import TINY, run_cli

    from trainer.launch.processes import find_allocator

    if find_allocator("jemalloc") is None:
        pytest.skip("jemalloc is not installed (Debian: libjemalloc2; .ci/run installs it)")
    run_dir = tmp_path / "run"
    probe = [*TINY, "model._target_=spies.ProbeNet", "~model.width", "checkpoint.enabled=true"]
    assert run_cli(f"hydra.run.dir={run_dir}", *probe).returncode == 0
    resume = [
        f"hydra.run.dir={run_dir}",
        *probe,
        "ckpt_path=last",
        "trainer.max_epochs=2",
        "runtime.allocator=jemalloc",
    ]
    r = run_cli(*resume, "+model.bad_input_in_forward=true")
    assert r.returncode == 2 and "ProbeNet found bad input on purpose" in r.stderr, r.stderr[-2000:]
    overrides = (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert "bad_input_in_forward" in overrides and "runtime.allocator=jemalloc" in overrides, overrides
    # the same resume stopped before training (another model's checkpoint): the earlier files back
    before = (run_dir / ".hydra" / "overrides.yaml").read_text()
    r = run_cli(*resume, "+model.width=32")
    assert r.returncode == 2 and "holds another model" in r.stderr, r.stderr[-2000:]
    assert (run_dir / ".hydra" / "overrides.yaml").read_text() == before


def test_a_second_sweep_into_the_same_sweep_dir_is_refused(tmp_path):
    from conftest import TINY, run_cli

    sweep = tmp_path / "sweep"
    assert run_cli("-m", f"hydra.sweep.dir={sweep}", *TINY, "amp=false,true").returncode == 0
    before = _snapshot(sweep)
    r = run_cli("-m", f"hydra.sweep.dir={sweep}", *TINY, "channels_last=false,true")
    assert r.returncode == 2 and "hydra.sweep.dir" in r.stderr and "Traceback" not in r.stderr
    assert _snapshot(sweep) == before


def test_the_cache_never_writes_into_a_folder_of_the_users(tmp_path):
    import hashlib

    from trainer.data.cache import cached_copy
    from trainer.errors import ConfigError

    src = _jpegs(tmp_path / "src")
    name = f"src-{hashlib.sha1(str(src.resolve()).encode()).hexdigest()[:8]}"
    users = tmp_path / "cache" / name
    (users / "a").mkdir(parents=True)
    (users / "a" / "0.jpg").write_bytes(b"the user's own file")
    with pytest.raises(ConfigError, match="did not write"):
        cached_copy(str(src), str(tmp_path / "cache"))
    assert (users / "a" / "0.jpg").read_bytes() == b"the user's own file"
    copy = cached_copy(str(src), str(tmp_path / "other-cache"))  # a fresh cache dir: copied, and reused after
    assert cached_copy(str(src), str(tmp_path / "other-cache")) == copy and (Path(copy) / "a" / "0.jpg").exists()


def test_the_cache_refuses_a_folder_inside_the_data_or_holding_it(tmp_path):
    """data.cache=DIR/.cache copied the copy into itself and left a class ".cache" in the user's data;
    a cache folder holding the data would have it deleted with the cache. Refused, nothing written."""
    from trainer.data.cache import cached_copy
    from trainer.errors import ConfigError

    src = _jpegs(tmp_path / "data" / "src")
    before = _snapshot(tmp_path / "data")
    for cache, says in (
        (src / ".cache", "is inside data.root"),
        (src, "is data.root itself"),
        (tmp_path / "data", "holds data.root"),
    ):
        with pytest.raises(ConfigError, match=f"'data.cache={cache}' {says}"):
            cached_copy(str(src), str(cache))
    assert _snapshot(tmp_path / "data") == before and sorted(p.name for p in (tmp_path / "data").iterdir()) == ["src"]
    assert not (src / ".cache").exists()


def test_in_process_runs_never_write_into_a_killed_runs_dir(compose, tmp_path):
    from conftest import TINY

    from trainer.launch.run_dirs import OutputTaken
    from trainer.run import run

    killed = tmp_path / "killed"
    killed.mkdir()
    (killed / "metrics.json").write_text(
        json.dumps({"schema": 1, "status": "running", "epochs": [{"epoch": 0, "time_s": 1.0}]})
    )
    before = _snapshot(killed)
    with pytest.raises(OutputTaken):
        run(compose(*TINY), str(killed))
    assert _snapshot(killed) == before
