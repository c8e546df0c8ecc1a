"""``python -m neurarch_trace.server [options]`` runs the same as ``neurarch-trace serve``."""

import sys

from neurarch_trace.server.cli import main

if __name__ == "__main__":
    sys.exit(main())
