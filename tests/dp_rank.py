"""One rank of tests/test_distributed.py, started by torchrun: `dp_rank.py OUT` has rank 0
save every rank's `update_results` to OUT, with the error `check_in_sync` raises on a rank
whose replica drifted, what `Ranks.on_main` gives and raises, and the results of
`sharded_adamw_steps` and `fsdp_results`."""

import sys

import torch

from dp_cases import fsdp_results, sharded_adamw_steps, update_results
from rlvr.config import ConfigError
from rlvr.training.distributed import data_parallel

with data_parallel(torch.device("cpu")) as ranks:
    results = update_results(ranks)
    replica = torch.nn.Linear(2, 1)
    torch.nn.init.zeros_(replica.weight)
    torch.nn.init.zeros_(replica.bias)
    replica.bias.data += ranks.rank == 1  # rank 1 alone drifts
    try:
        ranks.check_in_sync(replica, "test")
    except RuntimeError as error:
        results["check_in_sync"] = str(error)
    results["on_main"] = ranks.on_main(lambda: 10 * ranks.rank + 7)

    def unreadable():
        raise ConfigError(f"rank {ranks.rank} could not read the file")

    try:
        ranks.on_main(unreadable)
    except ConfigError as error:
        results["on_main_error"] = str(error)
    results["sharded"], results["sharded_state"] = sharded_adamw_steps(ranks)
    results["fsdp"] = fsdp_results(ranks)
    everyone = ranks.gather(results)
    if ranks.main:
        torch.save(everyone, sys.argv[1])
