"""``python -m trainer.pack`` and ``trainer-pack``: the command's documented path (the code is ``trainer.data.pack``)."""

import sys

from trainer.data.pack import main

if __name__ == "__main__":
    sys.exit(main())
