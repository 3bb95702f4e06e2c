"""Preloaded by the verifier's fork server, so that each worker forked from it starts ready.

- The workers run only `rlvr.rewards.verify`'s own functions, so they never need the parent's
  main script. But multiprocessing re-runs that script (as ``__mp_main__``) in every worker
  whose ``__main__`` has another ``__file__``: for a script that imports torch, about 1.5 s
  of CPU before the first task. So the fork server installs an empty ``__main__`` carrying
  the script's path, and its workers skip the script altogether. While the fork server
  starts, the parent puts the script's path and its own ``sys.path`` in the environment
  (`verify._main_path_for_fork_server`); Python 3.11's fork server does not apply the
  parent's ``sys.path`` either (gh-117378). A main run with ``-m`` is left to
  multiprocessing. Only a process whose own main has no file (the fork server runs
  ``python -c``) acts on it.
- One math-verify call here builds math-verify's parsers, which a worker's first call would
  otherwise build (about 0.3 s each).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types

from rlvr.rewards.verify import MAIN_PATH_ENV, _math_verify_worker

_parent = json.loads(os.environ.get(MAIN_PATH_ENV) or "{}")
if _parent and getattr(sys.modules["__main__"], "__file__", None) is None:
    sys.path[:] = _parent["sys_path"]  # the workers' imports resolve as in the parent
    _stub = types.ModuleType("__mp_main__")
    _stub.__file__ = _parent["main_path"]  # what multiprocessing compares before a re-run
    sys.modules["__main__"] = sys.modules["__mp_main__"] = _stub

with contextlib.suppress(Exception):  # a broken math-verify is reported by the workers' calls
    _math_verify_worker("1", "1")
