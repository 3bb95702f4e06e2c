"""`python -m rlvr` (and `torchrun -m rlvr train ...`): the `rlvr` command line."""

from rlvr.cli import app

app(prog_name="rlvr")
