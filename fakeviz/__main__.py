"""``python -m fakeviz``: the command line (:mod:`fakeviz._frontends.cli`)."""

import sys

from ._frontends.cli import main

if __name__ == "__main__":
    sys.exit(main())
