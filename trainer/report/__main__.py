"""``python -m trainer.report DIR ... [--out DIR]``: rebuild the A/B report (see trainer/report/write.py)."""

import sys

from trainer.report.write import main

if __name__ == "__main__":
    sys.exit(main())
