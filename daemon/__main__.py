"""`python -m daemon` is the `recoveryd` command."""

from daemon.cli import main

main()
