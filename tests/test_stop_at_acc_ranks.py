"""stop_at_acc with a user's module whose ranks log different val_acc values (no ``sync_dist``): every
rank decides on the same number, the mean over ranks, and it is the number metrics.json records."""

from __future__ import annotations

import pytest
from conftest import read_metrics, run_cli


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_stop_at_acc_decides_on_the_mean_over_ranks_that_metrics_json_records(tmp_path):
    """Rank 0 logs 0, 0.125, 0.25, ..., rank 1 0.5 more: rank 1 alone reaches 0.5 in epoch 0, the mean
    (0.25, 0.375, 0.5) in epoch 2. The run stops at epoch 2, and the epochs record the means."""
    run_dir = tmp_path / "run"
    r = run_cli(
        f"hydra.run.dir={run_dir}",
        "data.num_samples=64",
        "data.image_size=16",
        "data.val_samples=16",
        "data.batch_size=8",
        "trainer.max_epochs=5",
        "monitor.enabled=false",
        "model._target_=spies.RankValAccModule",
        "strategy=ddp",
        "devices=2",
        "stop_at_acc=0.5",
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = read_metrics(run_dir)
    assert m["status"] == "ok" and m["device"]["count"] == 2
    assert [e["val_acc"] for e in m["epochs"]] == [0.25, 0.375, 0.5]
    assert m["stopped_at_acc_epoch"] == 2
    assert "val_acc differs across ranks" in r.stdout + r.stderr  # said: the model logs it without sync_dist
