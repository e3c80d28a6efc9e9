"""`python -m hpcbox`: the `hpcbox` command, from whichever environment runs it."""

from hpcbox.cli import main

main()
