"""``python -m trainer.torchrun LOG_DIR [torchrun args]``: the documented path of the job launcher's torchrun
(the code is ``trainer.launch.torchrun``; ``trainer.launch.processes`` starts every launched job through here)."""

import sys

from trainer.launch.torchrun import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
