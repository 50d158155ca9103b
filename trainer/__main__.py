"""`python -m trainer ...` is the `tandem` command (see trainer/cli/command.py)."""

import sys

from trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
