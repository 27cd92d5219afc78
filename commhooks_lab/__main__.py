import sys

from commhooks_lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
