"""``python -m trainer.tune +recipe=resnet50 [overrides]``: see trainer/tune/app.py."""

from trainer.tune.app import main

main()
