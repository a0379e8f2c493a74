"""``python -m rlonce.cli``: the same entry point as the ``rlonce`` console script."""

import sys

from rlonce.cli import main

if __name__ == "__main__":
    sys.exit(main())
