"""Preloaded by the verifier's fork server, so that each worker forked from it starts ready.

- The parent's main script runs here once, as ``__mp_main__``, and the workers inherit the
  module instead of each re-running the script (its imports, torch included) before its first
  task. CPython's own ``"__main__"`` preload does this from the fix of gh-126631 on
  (September 2025), and this module then finds the work done. While the fork server starts,
  the parent puts the script's path and its own ``sys.path`` in the environment
  (`verify._main_path_for_fork_server`): Python 3.11's fork server does not apply the
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
from multiprocessing import process, spawn

from rlvr.rewards.verify import MAIN_PATH_ENV, _math_verify_worker

_parent = json.loads(os.environ.get(MAIN_PATH_ENV) or "{}")
if _parent and getattr(sys.modules["__main__"], "__file__", None) is None:
    sys.path[:] = _parent["sys_path"]  # the script's own imports resolve as in the parent
    process.current_process()._inheriting = True  # as multiprocessing sets it for this import
    try:
        spawn.import_main_path(_parent["main_path"])
    except Exception:  # each worker then re-runs the script itself, as it would without this
        pass
    finally:
        del process.current_process()._inheriting

with contextlib.suppress(Exception):  # a broken math-verify is reported by the workers' calls
    _math_verify_worker("1", "1")
