"""Each loader object resumes mid-epoch at the exact next sample, through a real checkpoint: the torch
loader and DALI, on one rank (in-process) and on two (``train.py strategy=ddp devices=2``); and both
loaders read the same samples in the same order under any strategy, so a checkpoint of one resumes
with the other. The images are one per class, so a batch's labels name its files."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import read_metrics, run_cli
from spies import BatchRecorder

from trainer.data import ImageDataModule

LOADERS = ["torch", "dali"]


def _folder_args(root, loader: str) -> list:
    return [
        "data=imagefolder",
        f"data.root={root}",
        f"data.loader={loader}",
        "data.image_size=16",
        "data.batch_size=4",
        "data.drop_last=false",
    ]


def _labels(stop_at=None):
    """The labels of every training batch by (epoch, batch index); stops the fit at ``stop_at``."""
    return BatchRecorder(lambda batch: batch[1].tolist(), stop_at)


@pytest.mark.parametrize("loader, workers", [("torch", 0), ("torch", 2), ("dali", 1)])
def test_one_rank_resumed_mid_epoch_trains_the_exact_next_samples(
    train, add_callbacks, tmp_path, one_per_class, loader, workers
):
    """23 images in batches of 4: 6 steps an epoch. The checkpoint of step 9 is saved after batch 2 of
    epoch 1; the fit dies at batch 4; the resumed fit trains batches 3-5 of epoch 1, the very samples
    the uninterrupted run trained there (with loader workers too, whose iterator draws its indices as
    soon as it is made)."""
    if loader == "dali":
        pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is a test dependency: pip install -e '.[test]'")
    args = [*_folder_args(one_per_class, loader), "trainer.max_epochs=2", "checkpoint.enabled=true"]
    args += ["checkpoint.every_n_steps=3", "checkpoint.keep_last_k=-1", f"data.num_workers={workers}"]
    straight = _labels()
    add_callbacks(straight)
    assert train(*args)[0]["status"] == "ok"
    assert sorted(sum((straight.seen[(1, i)] for i in range(6)), [])) == list(range(23))
    add_callbacks(_labels(stop_at=(1, 4)))
    with pytest.raises(RuntimeError, match="on purpose"):
        train(*args)
    last = tmp_path / "run2" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=False)["ImageDataModule"]
    assert saved["position"] == [1, 3] and saved["loader"] == loader
    resumed = _labels()
    add_callbacks(resumed)
    m, _ = train(*args, f"ckpt_path={last}")
    assert m["status"] == "ok" and m["loader"] == loader
    assert sorted(resumed.seen) == [(1, 3), (1, 4), (1, 5)]
    assert all(resumed.seen[at] == straight.seen[at] for at in resumed.seen), (resumed.seen, straight.seen)
    if workers:
        # the checkpoint of step 6 is epoch 0's last step: Lightning resumes at epoch 1, and the loader,
        # whose workers draw their indices when its iterator is made (before Lightning's set_epoch),
        # must already be at epoch 1 then
        step6 = tmp_path / "run1" / "checkpoints" / "step0000006.ckpt"
        assert torch.load(step6, weights_only=False)["ImageDataModule"]["position"] == [1, 0]
        resumed = _labels()
        add_callbacks(resumed)
        assert train(*args, f"ckpt_path={step6}")[0]["status"] == "ok"
        assert sorted(resumed.seen) == [(1, i) for i in range(6)]
        assert all(resumed.seen[at] == straight.seen[at] for at in resumed.seen), (resumed.seen, straight.seen)


def test_a_position_restored_after_the_loader_was_made_still_moves_it(compose, one_per_class):
    """FSDP restores the checkpoint after setting up, and the optimizers' set-up may already have asked
    for the training loader (Lightning keeps that one): the position goes into its order, which then
    starts at the resumed epoch, past the batches already trained."""
    from trainer.data.sampler import EpochShuffleSampler

    cfg = compose(*_folder_args(one_per_class, "torch"))
    dm = ImageDataModule(cfg.data, cfg.seed)
    dm.build()
    loader = dm.train_dataloader()  # before the checkpoint is restored
    dm.load_state_dict({"position": [1, 2], "plan": {"processes": 1, "batch_size": 4}})
    expected = EpochShuffleSampler(23, cfg.seed)
    expected.set_epoch(1)
    assert [int(y) for _, labels in loader for y in labels] == list(expected)[8:]


@pytest.mark.parametrize("world", [1, 2])
def test_dali_reads_the_torch_loaders_order_under_a_distributed_strategy(compose, one_per_class, world):
    """Under ``strategy=ddp`` (also ``devices=1``, where Lightning would wrap the torch loader's sampler
    and shuffle it again) both loaders deal the same permutation to the ranks, skip the same samples
    after a resume, and so make the same rows of the A/B table."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is a test dependency: pip install -e '.[test]'")
    for rank in range(world):
        orders = {}
        for loader in ("torch", "dali"):
            cfg = compose(*_folder_args(one_per_class, loader))
            dm = ImageDataModule(cfg.data, cfg.seed)
            dm.build()
            dm.trainer = SimpleNamespace(
                world_size=world,
                global_rank=rank,
                current_epoch=1,
                distributed_sampler_kwargs={"num_replicas": world, "rank": rank},
                strategy=SimpleNamespace(root_device=torch.device("cpu")),
                limit_train_batches=1.0,
                limit_val_batches=1.0,
            )
            dm.load_state_dict({"position": [1, 1]})  # a resume after one batch of epoch 1
            batches = dm.train_dataloader()
            if loader == "torch":
                # dealt already, as the DALI loader's is: Lightning leaves a DistributedSampler in place
                # (it would wrap any other one and shuffle it again, also for one process)
                assert isinstance(batches.sampler, torch.utils.data.DistributedSampler), batches.sampler
                batches.sampler.set_epoch(1)  # as Lightning does before each epoch
            orders[loader] = [int(y) for _, labels in batches for y in labels]
        assert len(orders["torch"]) == -(-23 // world) - 4  # this rank's share, less the batch trained
        assert orders["dali"] == orders["torch"], (world, rank, orders)


def _recorded(record, rank: int, epoch: int) -> list:
    """LabelRecorder's lines: one batch's labels each."""
    path = record / f"rank{rank}_epoch{epoch}.txt"
    return [[int(v) for v in line.split()] for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
@pytest.mark.whole_machine  # two ranks: one core each
def test_two_ranks_resumed_mid_epoch_train_the_exact_next_samples_with_either_loader(one_per_class, tmp_path):
    """A DALI run on 2 DDP ranks reads disjoint halves of every epoch; its checkpoint of step 4 (after
    batch 0 of epoch 1) resumes with DALI and with the torch loader, and each rank trains the rest of
    its own share of epoch 1, batch for batch as the uninterrupted run did."""
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI is a test dependency: pip install -e '.[test]'")
    common = [
        "data.image_size=16",
        "data.batch_size=4",
        "data.drop_last=false",
        "strategy=ddp",
        "devices=2",
        "trainer.max_epochs=2",
        "model._target_=rank_spies.LabelRecorder",
        "monitor.enabled=false",
        "data=imagefolder",
        f"data.root={one_per_class}",
    ]
    straight = tmp_path / "straight"
    r = run_cli(
        f"hydra.run.dir={straight}",
        *common,
        "data.loader=dali",
        f"+model.record_dir={straight / 'seen'}",
        "checkpoint.every_n_steps=4",
        "checkpoint.keep_last_k=-1",
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    for epoch in (0, 1):
        seen = [sum(_recorded(straight / "seen", k, epoch), []) for k in (0, 1)]
        # 23 samples dealt to 2 ranks: 12 each, the first sample of the epoch padded onto rank 1
        assert len(seen[0]) == len(seen[1]) == 12, seen
        assert set(seen[0]) | set(seen[1]) == set(range(23)) and len(set(seen[0]) & set(seen[1])) <= 1, seen
    mid = straight / "checkpoints" / "step0000004.ckpt"  # 3 steps an epoch: after batch 0 of epoch 1
    assert torch.load(mid, weights_only=False)["ImageDataModule"]["position"] == [1, 1]
    for loader in ("dali", "torch"):
        run_dir = tmp_path / f"resumed-{loader}"
        r = run_cli(
            f"hydra.run.dir={run_dir}",
            *common,
            f"data.loader={loader}",
            f"+model.record_dir={run_dir / 'seen'}",
            f"ckpt_path={mid}",
        )
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        for k in (0, 1):
            assert _recorded(run_dir / "seen", k, 0) == []
            assert _recorded(run_dir / "seen", k, 1) == _recorded(straight / "seen", k, 1)[1:], (loader, k)
        assert read_metrics(run_dir)["loader"] == loader
