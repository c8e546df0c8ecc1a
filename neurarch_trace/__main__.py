"""``python -m neurarch_trace`` runs the same command line as ``neurarch-trace``."""

import sys

from neurarch_trace.cli import main

if __name__ == "__main__":
    sys.exit(main())
