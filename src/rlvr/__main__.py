"""`python -m rlvr` (and `torchrun -m rlvr train ...`): the `rlvr` command line."""

from rlvr.cli import main

main()
