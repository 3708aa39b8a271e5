"""``python -m masd``: the same command line as ``masd``."""

from masd.cli import main

if __name__ == "__main__":
    main(prog_name="masd")
