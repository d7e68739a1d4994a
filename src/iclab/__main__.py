"""``python -m iclab``: the same command line as ``iclab``."""

from iclab.cli import main

if __name__ == "__main__":
    main()
