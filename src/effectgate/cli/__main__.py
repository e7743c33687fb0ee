"""``python -m effectgate.cli``: the same as the ``effectgate`` console script."""

from effectgate.cli import main

main()
