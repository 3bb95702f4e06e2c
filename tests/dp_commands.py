"""Several `rlvr` commands of tests/test_distributed.py in one torchrun launch, started by it:
`dp_commands.py COMMANDS_JSON` runs each command (a name and its arguments) through the CLI in
this process, under one gloo group that the commands use and leave open. One launch starts
torch and transformers once on each rank instead of once a command (some 15 s of a 2-core VM
each). Rank 0 prints `=== <name>` before each command's output; barriers keep the commands'
outputs apart. A command that fails ends the launch with its exit status."""

import json
import sys
from pathlib import Path

import torch.distributed as dist

from rlvr.cli import app

dist.init_process_group("gloo")
for name, arguments in json.loads(Path(sys.argv[1]).read_text()):
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"=== {name}", flush=True)
    code = app(arguments, standalone_mode=False)  # the CLI's own exit status, not raised
    if code:
        sys.exit(f"rlvr {name} exited with {code}")
    sys.stdout.flush()
    dist.barrier()
dist.destroy_process_group()
