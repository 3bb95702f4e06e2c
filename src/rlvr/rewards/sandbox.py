"""Run untrusted Python in a confined child process: resource limits, no network, a scratch dir.

`run_python(code, stdin)` writes `code` to a fresh scratch directory, runs it in a new session
with a scrubbed environment (``PATH``, ``HOME``/``TMPDIR`` = the scratch dir, ``LANG``), feeds
it `stdin`, reads stdout and stderr up to `max_output_bytes` each (more kills the program), kills
the whole process group (and so the PID namespace) when the program ends or at the wall-clock
`timeout_s`, and removes the scratch directory. In every mode the child
(`rlvr.rewards._sandbox_child`, a fresh ``python -I -S``) deletes its program file before
running it, has no capabilities and no-new-privileges, and limits CPU seconds (SIGXCPU), address
space (MemoryError), file size (SIGXFSZ), processes, and core dumps (none).

Isolation modes, the strongest that works chosen at first use (`best_isolation`); a weaker one is
logged as a warning, and `isolation_report` names the mechanisms in force:

- ``namespaces``: new user (uid mapped to 0 inside), PID, network and mount namespaces, entered
  with ``unshare(2)``; needs unprivileged user namespaces and Linux ≥ 5.12. Network: the new
  network namespace has no interface up (no 127.0.0.1 of the host, no abstract Unix socket of
  the host), and a seccomp filter refuses ``socket()``, so no Unix socket path of the host
  either. Signals: the program is PID 1 of its PID namespace, sees no process outside it and
  has ``getppid() == 0``, so ``kill(getppid())`` hits only its own process group. As PID 1 it
  ignores signals it sends itself and SIGXCPU: the CPU limit ends it with SIGKILL one second
  later. Files: every mount is read-only; the scratch directory is a private tmpfs of
  `max_file_mb` MiB; ``/proc`` shows only the sandbox. Processes: RLIMIT_NPROC, counted per
  sandbox (in its user namespace).
- ``seccomp``: no user namespaces (Docker's default seccomp profile, Ubuntu's AppArmor
  restriction). Network: ``socket()`` refused. Signals: with Landlock ABI ≥ 6 (Linux ≥ 6.12)
  no signal leaves the sandbox; without it ``kill`` may only target its own process group and
  tkill/tgkill are refused. Refused too: setsid/setpgid (so the final group kill reaches every
  process), ptrace, process_vm_*, pidfd_open/pidfd_getfd, io_uring. Files, with Landlock (Linux
  ≥ 5.13): writes only beneath the scratch dir and to /dev/null, no reading of ``/proc`` (other
  processes' environments); without Landlock only Unix permissions guard files. Processes:
  RLIMIT_NPROC counts the whole uid, so it is set to the uid's count at start plus
  `max_processes`.
- ``audit-hook``: no seccomp filter for this CPU (not x86-64 or arm64). A Python audit hook in
  the child refuses sockets, ctypes, new programs, signals to other processes, writes outside
  the scratch dir and other processes' ``/proc``; Landlock as above where present. Best effort:
  native code is not bound by it, and ``os.setsid`` is not audited.

Linux does not enforce RLIMIT_NPROC for a process owned by root. A root trainer therefore runs
the sandbox as ``nobody`` when ``nobody`` can start the interpreter. Otherwise (an interpreter
under ``/root``, as in many containers) the sandbox stays root-owned, with a logged warning: the
seccomp filter (or audit hook) then allows new threads but no new processes, and the program can
read files that only root can read (writes are still refused as above).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pwd
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rlvr.rewards import _sandbox_child

logger = logging.getLogger(__name__)

ISOLATION_MODES = ("namespaces", "seccomp", "audit-hook")
"""The isolation modes, strongest first."""

PROGRAM_NAME = "solution.py"
_CHILD_SOURCE = Path(_sandbox_child.__file__).read_text(encoding="utf-8")
_PROBE_TIMEOUT_S = 30.0
_DRAIN_S = 0.5  # how long output is still read after the program exited
_READ_CHUNK = 65536


class SandboxError(RuntimeError):
    """The sandbox could not be set up (a fault of the machine, not of the program in it)."""


@dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed program did."""

    exit_code: int | None
    """Exit status; None when it was killed by a signal (then see `killed_by_signal`)."""
    stdout: str
    """Standard output, at most `max_output_bytes` of it (decoded as UTF-8, errors replaced)."""
    stderr: str
    """Standard error, at most `max_output_bytes` of it."""
    timed_out: bool
    """It ran past the wall-clock timeout and was killed."""
    killed_by_signal: int | None
    """The signal that ended it (SIGKILL after a timeout or too much output)."""
    output_truncated: bool
    """It wrote more than `max_output_bytes` to stdout or stderr and was killed."""
    wall_s: float
    """Seconds from start to the end of the last process."""
    isolation: str
    """The isolation mode it ran under (one of `ISOLATION_MODES`)."""

    @property
    def ok(self) -> bool:
        """Exited with status 0, in time, within the output cap."""
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated


# --------------------------------------------------------------------------- who runs it


@dataclass(frozen=True)
class _Identity:
    """The uid/gid the sandbox runs as when the trainer is root (None: the trainer's own)."""

    uid: int | None
    gid: int | None

    @property
    def is_root(self) -> bool:
        return (self.uid if self.uid is not None else os.geteuid()) == 0


def _nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        return 65534, 65534


def _popen_identity(identity: _Identity) -> dict:
    if identity.uid is None:
        return {}
    return {"user": identity.uid, "group": identity.gid, "extra_groups": []}


_identity_lock = threading.Lock()
_identity_cache: _Identity | None = None


def _sandbox_identity() -> _Identity:
    """``nobody`` for a root trainer when ``nobody`` can start the interpreter; else our own."""
    global _identity_cache
    with _identity_lock:
        if _identity_cache is None:
            _identity_cache = _Identity(None, None)
            if os.geteuid() == 0:
                nobody = _Identity(*_nobody())
                if _can_start_interpreter(nobody):
                    _identity_cache = nobody
                else:
                    logger.warning(
                        "code sandbox: the trainer runs as root and 'nobody' cannot start %s, "
                        "so sandboxed programs run as root (in their namespaces) and may start "
                        "threads but no processes",
                        sys.executable,
                    )
        return _identity_cache


def _can_start_interpreter(identity: _Identity) -> bool:
    check = [sys.executable, "-I", "-S", "-c", "import ctypes, resource"]
    try:
        done = subprocess.run(
            check, cwd="/", env=_environment("/"), capture_output=True,
            timeout=_PROBE_TIMEOUT_S, check=False, **_popen_identity(identity),
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


# --------------------------------------------------------------------------- launching


def _environment(scratch: str) -> dict[str, str]:
    """The whole environment of the sandbox: nothing of the trainer's."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": scratch, "TMPDIR": scratch,
            "LANG": "C.UTF-8"}  # fmt: skip


def _command(config: dict[str, object]) -> list[str]:
    """The child interpreter with its settings as ``key=value`` arguments."""
    settings = [f"{key}={value}" for key, value in config.items()]
    return [sys.executable, "-I", "-S", "-c", _CHILD_SOURCE, *settings]


def _make_scratch(identity: _Identity) -> str:
    scratch = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    if identity.uid is not None:
        os.chown(scratch, identity.uid, identity.gid)
    return scratch


def _remove_scratch(scratch: str) -> None:
    """Delete `scratch`; what a program made undeletable (mode 000 directories, possible in the
    seccomp and audit-hook modes of a non-root trainer) stays behind with a warning."""
    shutil.rmtree(scratch, ignore_errors=True)
    if os.path.exists(scratch):
        logger.warning("code sandbox: could not remove all of the scratch directory %s", scratch)


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the sandbox's process group (in the namespaces mode: the whole PID namespace)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(process.pid, signal.SIGKILL)


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # Linux < 5.3 or not Linux
        return None


@dataclass
class _Exchange:
    stdout: bytearray
    stderr: bytearray
    timed_out: bool = False
    truncated: bool = False


def _exchange(process: subprocess.Popen, data: bytes, timeout_s: float, cap: int) -> _Exchange:
    """Feed `data` to stdin and read stdout/stderr (at most `cap` bytes each) until the program
    and its output end, the deadline passes, or the output goes over the cap. Always kills the
    process group at the end: in the seccomp and audit-hook modes stray children may outlive
    the program."""
    result = _Exchange(bytearray(), bytearray())
    deadline = time.monotonic() + timeout_s
    pidfd = _pidfd(process.pid)
    try:
        _pump(process, data, deadline, cap, pidfd, result)
        if not (result.timed_out or result.truncated):
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                result.timed_out = True
    finally:
        if pidfd is not None:
            os.close(pidfd)
        _kill_group(process)
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            stream.close()
    return result


def _pump(
    process: subprocess.Popen,
    data: bytes,
    deadline: float,
    cap: int,
    pidfd: int | None,
    result: _Exchange,
) -> None:
    """The I/O loop of `_exchange`; output is read for `_DRAIN_S` more after the program exits
    (`pidfd` readable), whose group is killed at once."""
    buffers = {process.stdout: result.stdout, process.stderr: result.stderr}
    exited_at: float | None = None
    written = 0
    with selectors.DefaultSelector() as selector:
        for stream in buffers:
            selector.register(stream, selectors.EVENT_READ)
        if data:
            os.set_blocking(process.stdin.fileno(), False)
            selector.register(process.stdin, selectors.EVENT_WRITE)
        else:
            process.stdin.close()
        if pidfd is not None:
            selector.register(pidfd, selectors.EVENT_READ)
        open_streams = set(buffers)
        while open_streams and not result.truncated:
            now = time.monotonic()
            limit = deadline if exited_at is None else min(deadline, exited_at + _DRAIN_S)
            if now >= limit:
                result.timed_out = exited_at is None
                return
            for key, _ in selector.select(limit - now):
                stream = key.fileobj
                if stream is process.stdin:
                    try:
                        written += os.write(stream.fileno(), data[written : written + _READ_CHUNK])
                    except BrokenPipeError:  # the program stopped reading
                        written = len(data)
                    if written == len(data):
                        selector.unregister(stream)
                        stream.close()
                elif stream == pidfd:
                    selector.unregister(pidfd)
                    exited_at = time.monotonic()
                    _kill_group(process)
                else:
                    chunk = os.read(stream.fileno(), _READ_CHUNK)
                    if not chunk:
                        selector.unregister(stream)
                        open_streams.discard(stream)
                    buffer = buffers[stream]
                    room = cap - len(buffer)
                    buffer += chunk[:room]
                    result.truncated |= len(chunk) > room


def _spawn(
    mode: str, scratch: str, identity: _Identity, config: dict[str, object]
) -> subprocess.Popen:
    config = {"mode": mode, "scratch": scratch, "root": int(identity.is_root), **config}
    return subprocess.Popen(
        _command(config),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=scratch, env=_environment(scratch), start_new_session=True, close_fds=True,
        **_popen_identity(identity),
    )  # fmt: skip


def _setup_failure(returncode: int | None, stderr: str, nonce: str) -> str | None:
    """The child's setup-failure message, if that is how it ended: exit status
    `SETUP_FAILED_EXIT` and the run's `nonce` on the first line of stderr, then the message."""
    first, _, message = stderr.partition("\n")
    if (
        returncode == _sandbox_child.SETUP_FAILED_EXIT
        and first == nonce
        and message.startswith(_sandbox_child.SETUP_FAILED)
    ):
        return message.strip()
    return None


# --------------------------------------------------------------------------- mode detection

_probe_lock = threading.Lock()
_probes: dict[str, str | SandboxError] = {}
_best_lock = threading.Lock()
_best: str | None = None


def _probe(mode: str) -> str:
    """What holds in `mode` on this machine (space-separated names); SandboxError if it fails."""
    with _probe_lock:
        if mode not in _probes:
            _probes[mode] = _run_probe(mode)
        outcome = _probes[mode]
    if isinstance(outcome, SandboxError):
        raise outcome
    return outcome


def _run_probe(mode: str) -> str | SandboxError:
    identity = _sandbox_identity()
    scratch = _make_scratch(identity)
    limits = {"program": "", "cpu_s": 10, "memory_mb": 512, "max_processes": 8, "max_file_mb": 1}
    try:
        process = _spawn(mode, scratch, identity, limits)
        out = _exchange(process, b"", _PROBE_TIMEOUT_S, 1 << 16)
    except OSError as exc:
        return SandboxError(f"isolation mode {mode!r} cannot start: {exc}")
    finally:
        _remove_scratch(scratch)
    if process.returncode != 0:
        stderr = out.stderr.decode(errors="replace").strip()
        return SandboxError(f"isolation mode {mode!r} fails here: {stderr or process.returncode}")
    return out.stdout.decode().strip()


def best_isolation() -> str:
    """The strongest isolation mode that works here (probed once; a weaker one is logged)."""
    global _best
    with _best_lock:
        if _best is not None:
            return _best
        failures = []
        for mode in ISOLATION_MODES:
            try:
                report = _probe(mode)
            except SandboxError as exc:
                failures.append(str(exc))
                continue
            if failures:
                logger.warning(
                    "code sandbox: falling back to the %r isolation mode (%s) because %s",
                    mode, report, "; ".join(failures),
                )  # fmt: skip
            else:
                logger.info("code sandbox: %r isolation mode (%s)", mode, report)
            _best = mode
            return mode
        raise SandboxError("no sandbox isolation mode works here: " + "; ".join(failures))


def isolation_report(mode: str | None = None) -> str:
    """The mechanisms in force in `mode` (default: `best_isolation()`), e.g. ``"seccomp ..."``."""
    return _probe(mode or best_isolation())


# --------------------------------------------------------------------------- public entry


def run_python(
    code: str,
    stdin: str = "",
    *,
    timeout_s: float = 5.0,
    cpu_s: int | None = None,
    memory_mb: int = 512,
    max_processes: int = 32,
    max_file_mb: int = 16,
    max_output_bytes: int = 1 << 20,
    isolation: str | None = None,
) -> SandboxResult:
    """Run the Python program `code` with `stdin` in the sandbox and return what it did.

    `timeout_s` is the wall-clock limit (the process group is killed); `cpu_s` the CPU-time
    limit of each process (default: `timeout_s` rounded up, plus 1, so the wall clock ends a
    busy loop first); `memory_mb` its address space; `max_processes` the processes and threads
    it may have at once, itself included (a root-owned sandbox: no new processes, see the
    module docstring); `max_file_mb` the largest file it may write (in the namespaces mode also
    the size of its scratch tmpfs); `max_output_bytes` the most stdout and stderr kept, each
    (more kills it); `isolation` one of `ISOLATION_MODES` (default: the strongest that works).
    Whatever the program does is reported in the result; only a sandbox that cannot be set up
    (or an `isolation` that does not work here) raises `SandboxError`.
    """
    if timeout_s <= 0 or memory_mb <= 0 or max_processes <= 0 or max_file_mb <= 0:
        raise ValueError("timeout_s, memory_mb, max_processes and max_file_mb must be positive")
    if isolation is not None and isolation not in ISOLATION_MODES:
        raise ValueError(f"unknown isolation {isolation!r}; choose from {ISOLATION_MODES}")
    mode = isolation or best_isolation()
    _probe(mode)
    identity = _sandbox_identity()
    limits = {
        "program": PROGRAM_NAME,
        "cpu_s": cpu_s if cpu_s is not None else math.ceil(timeout_s) + 1,
        "memory_mb": memory_mb,
        "max_processes": max_processes,
        "max_file_mb": max_file_mb,
    }
    scratch = _make_scratch(identity)
    try:
        program = Path(scratch) / PROGRAM_NAME
        program.write_text(code, encoding="utf-8")
        if identity.uid is not None:
            os.chown(program, identity.uid, identity.gid)
        start = time.monotonic()
        nonce = secrets.token_hex(16)
        process = _spawn(mode, scratch, identity, {**limits, "nonce": nonce})
        out = _exchange(process, stdin.encode("utf-8"), timeout_s, max_output_bytes)
        wall_s = time.monotonic() - start
    finally:
        _remove_scratch(scratch)
    stderr = out.stderr.decode("utf-8", errors="replace")
    failure = _setup_failure(process.returncode, stderr, nonce)
    if failure is not None:
        raise SandboxError(failure)
    code_or_signal = process.returncode
    return SandboxResult(
        exit_code=code_or_signal if code_or_signal >= 0 else None,
        stdout=out.stdout.decode("utf-8", errors="replace"),
        stderr=stderr,
        timed_out=out.timed_out,
        killed_by_signal=-code_or_signal if code_or_signal < 0 else None,
        output_truncated=out.truncated,
        wall_s=wall_s,
        isolation=mode,
    )
