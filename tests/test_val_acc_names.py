"""A user's LightningModule names its accuracy as it likes: ``val/acc`` (the built-in classifier's) or
``val_acc``. metrics.json's epochs and ``stop_at_acc`` read either, and a validation that logs no
accuracy at all is said once rather than leaving stop_at_acc silently inert."""

from __future__ import annotations

import logging


def test_a_module_that_logs_val_acc_is_journaled_and_stopped_on_it(train):
    """spies.RankValAccModule logs ``val_acc`` = 0.125 per epoch on a single rank: 0, 0.125, 0.25 reaches
    stop_at_acc=0.25 at epoch 2, and each epoch's record carries its value."""
    m, _ = train("model._target_=spies.RankValAccModule", "trainer.max_epochs=5", "stop_at_acc=0.25")
    assert m["status"] == "ok", m["error"]
    assert [e["val_acc"] for e in m["epochs"]] == [0.0, 0.125, 0.25]
    assert m["stopped_at_acc_epoch"] == 2
    assert m["val_acc"] == 0.25  # the run's val_acc too: what the report's column and its ACCURACY DROP read


def test_stop_at_acc_with_a_validation_that_logs_no_accuracy_trains_on_and_says_so_once(train, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer.callbacks.stop_at_acc"):
        m, _ = train("model._target_=spies.ValLossOnlyModule", "trainer.max_epochs=2", "stop_at_acc=0.5")
    assert m["status"] == "ok", m["error"]
    assert len(m["epochs"]) == 2 and m["stopped_at_acc_epoch"] is None
    assert all("val_loss" in e and "val_acc" not in e for e in m["epochs"]), m["epochs"]
    said = [r.getMessage() for r in caplog.records if r.name == "trainer.callbacks.stop_at_acc"]
    assert said == ["stop_at_acc=0.5: the validation logged no val/acc or val_acc, so training runs every epoch"]
