"""``python -m neurarch_trace`` runs the same command line as ``neurarch-trace``."""

from neurarch_trace.cli import run

if __name__ == "__main__":
    run()
