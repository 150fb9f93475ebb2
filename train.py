"""Train a recipe with optimizations switched on the command line (a thin entry point).

    python train.py +recipe=resnet50 amp=true compile=true
    python train.py -m +recipe=resnet50 scale=smoke amp=false,true channels_last=false,true

All logic lives in the ``trainer`` package; see README.md.
"""

from trainer.cli import main

if __name__ == "__main__":
    main()
