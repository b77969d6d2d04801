"""`python -m trainer` (and `torchrun -m trainer`): the only place that exits."""

import sys

from trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
