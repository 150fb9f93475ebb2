"""``python -m trainer.tune +recipe=resnet50 [overrides]``: see trainer/tune/app.py."""

from .app import main

main()
