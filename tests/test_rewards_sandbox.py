"""The code sandbox against hostile programs: each attack is contained within its timeout, and
the trainer (this test process) and its neighbours live on. Every test runs in every isolation
mode that works on this machine."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlvr.rewards import (
    SandboxError,
    SandboxResult,
    isolation_report,
    run_python,
    sandbox as sandbox_module,
)
from rlvr.rewards._sandbox_child import SETUP_FAILED, SETUP_FAILED_EXIT, seccomp_machine
from rlvr.rewards.sandbox import ISOLATION_MODES, PROGRAM_NAME, _Identity

MARGIN_S = 1.5  # start-up and clean-up on two busy cores


@pytest.fixture(params=ISOLATION_MODES)
def mode(request: pytest.FixtureRequest) -> str:
    try:
        isolation_report(request.param)
    except SandboxError as exc:
        pytest.skip(str(exc))
    return request.param


def run_timed(code: str, stdin: str = "", **kwargs: object) -> SandboxResult:
    """`run_python`, asserting that it returned within its wall-clock timeout plus a margin."""
    start = time.monotonic()
    result = run_python(code, stdin, **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < kwargs["timeout_s"] + MARGIN_S, f"took {elapsed:.2f} s"
    return result


def processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line contains `text` (the sandbox's scratch path)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if text.encode() in cmdline:
            pids.append(int(entry))
    return pids


def assert_no_process_left(scratch: str) -> None:
    deadline = time.monotonic() + 2.0
    while processes_mentioning(scratch) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(scratch) == []


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen]:
    """A process of ours outside the sandbox that prints each SIGURG it gets."""
    script = (
        "import signal, time\n"
        "signal.signal(signal.SIGURG, lambda *_: print('got SIGURG', flush=True))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    yield process
    process.kill()
    process.wait()


def bystander_output(process: subprocess.Popen) -> str:
    assert process.poll() is None, "the bystander was killed"
    process.kill()
    return process.communicate()[0]


# ------------------------------------------------------------------------------ normal programs


def test_normal_programs_run(mode: str) -> None:
    echo = run_timed(
        "import sys\nprint(sys.stdin.read().upper(), end='')",
        "abc\nxyz\n",
        timeout_s=3,
        isolation=mode,
    )
    assert (echo.exit_code, echo.stdout, echo.ok, echo.isolation) == (0, "ABC\nXYZ\n", True, mode)
    assert (echo.killed_by_signal, echo.timed_out, echo.output_truncated) == (None, False, False)
    exits = run_timed("import sys\nprint('bye')\nsys.exit(3)", timeout_s=3, isolation=mode)
    assert (exits.exit_code, exits.stdout, exits.ok) == (3, "bye\n", False)
    assert exits.killed_by_signal is None
    raises = run_timed("print('start')\n1 / 0", timeout_s=3, isolation=mode)
    assert raises.exit_code == 1 and raises.stdout == "start\n"
    assert "ZeroDivisionError" in raises.stderr
    threads = run_timed(
        "import threading\nout = []\n"
        "ts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sorted(out))",
        timeout_s=3,
        isolation=mode,
    )
    assert threads.stdout == "[0, 1, 2, 3]\n"


def test_output_is_read_for_half_a_second_after_the_program_ends() -> None:
    """A process that outlives the program and escaped its group (``os.setsid`` is not refused
    in the audit-hook mode) is read for `_DRAIN_S` = 0.5 s after the program exits, no longer."""
    stray = (
        "import sys, time\nsys.stdin.read()\ntime.sleep(0.1)\nprint('early', flush=True)\n"
        "time.sleep(0.65)\nprint('late', flush=True)"
    )
    program = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-I', '-S', '-c', {stray!r}], "
        "stdin=subprocess.PIPE, start_new_session=True)"
    )  # it exits at once; the stray reads EOF then and prints 0.1 s and 0.75 s later
    process = subprocess.Popen(
        [sys.executable, "-I", "-S", "-c", program],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    out = sandbox_module._exchange(process, b"", 5.0, 1000)
    assert (bytes(out.stdout), out.timed_out, out.truncated) == (b"early\n", False, False)


def test_concurrent_runs_do_not_mix(mode: str) -> None:
    results: dict[int, SandboxResult] = {}

    def run(i: int) -> None:
        results[i] = run_python(f"print({i} * {i})", timeout_s=5, isolation=mode)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert {i: r.stdout for i, r in results.items()} == {i: f"{i * i}\n" for i in range(4)}


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown isolation"):
        run_python("print(1)", isolation="chroot")
    for limit in ("timeout_s", "memory_mb", "max_processes", "max_file_mb"):
        with pytest.raises(ValueError, match="positive"):
            run_python("print(1)", **{limit: 0})


@pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")
def test_the_audit_hook_mode_works_on_any_linux() -> None:
    """It needs no namespaces, seccomp or Landlock, so a machine where it fails has a broken
    sandbox (every test above would skip its modes), not a missing feature."""
    assert "audit-hook" in isolation_report("audit-hook").split()[-1]
    result = run_python("print(6 * 7)", timeout_s=3, isolation="audit-hook")
    assert (result.stdout, result.ok, result.isolation) == ("42\n", True, "audit-hook")


def test_the_default_report_is_the_best_modes() -> None:
    assert isolation_report() == isolation_report(sandbox_module.best_isolation())


def test_a_mode_that_fails_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_module, "_probes", {})
    monkeypatch.setattr(sandbox_module, "_best", None)
    child = "import sys\nsys.stderr.write(' broken here \\n')\nsys.exit(3)"
    monkeypatch.setattr(sandbox_module, "_CHILD_SOURCE", child)
    with pytest.raises(SandboxError, match=r"^isolation mode 'seccomp' fails here: broken here$"):
        isolation_report("seccomp")
    monkeypatch.setattr(sandbox_module, "_CHILD_SOURCE", "import sys\nsys.exit(3)")
    with pytest.raises(SandboxError, match=r"^isolation mode 'audit-hook' fails here: 3$"):
        isolation_report("audit-hook")
    with pytest.raises(SandboxError) as caught:
        sandbox_module.best_isolation()
    assert str(caught.value) == (
        "no sandbox isolation mode works here: isolation mode 'namespaces' fails here: 3; "
        "isolation mode 'seccomp' fails here: broken here; "
        "isolation mode 'audit-hook' fails here: 3"
    )


def test_the_smallest_limits_are_accepted() -> None:
    result = run_python("print(6 * 7)", timeout_s=3, max_processes=1, max_file_mb=1)
    assert (result.stdout, result.ok) == ("42\n", True)
    # 1 MiB of address space is too little for the program itself: its failure, not a refusal
    tiny = run_python("print(6 * 7)", timeout_s=3, memory_mb=1)
    assert (tiny.exit_code, tiny.stdout) == (1, "")
    assert tiny.stderr.rstrip().endswith("MemoryError")


def test_the_limits_given_to_the_child(monkeypatch: pytest.MonkeyPatch) -> None:
    configs: list[dict[str, object]] = []
    spawn = sandbox_module._spawn

    nonces: list[object] = []

    def spy(mode: str, scratch: str, identity: _Identity, config: dict[str, object]):
        configs.append({key: value for key, value in config.items() if key != "nonce"})
        nonces.append(config["nonce"])
        return spawn(mode, scratch, identity, config)

    isolation_report()  # probed before the spy, so it sees only the programs' launches
    monkeypatch.setattr(sandbox_module, "_spawn", spy)
    run_python("pass")
    run_python("pass", timeout_s=2.5, memory_mb=100, max_processes=3, max_file_mb=2)
    run_python("pass", timeout_s=0.4, cpu_s=9)
    # the CPU limit defaults to the wall-clock timeout rounded up, plus one second
    assert configs == [
        {"program": PROGRAM_NAME, "cpu_s": 6, "memory_mb": 512, "max_processes": 32,
         "max_file_mb": 16},
        {"program": PROGRAM_NAME, "cpu_s": 4, "memory_mb": 100, "max_processes": 3,
         "max_file_mb": 2},
        {"program": PROGRAM_NAME, "cpu_s": 9, "memory_mb": 512, "max_processes": 32,
         "max_file_mb": 16},
    ]  # fmt: skip
    # each run's setup-failure nonce is fresh: 32 hex digits
    assert all(re.fullmatch(r"[0-9a-f]{32}", str(nonce)) for nonce in nonces)
    assert len(set(nonces)) == 3


def test_output_up_to_the_cap_is_kept_whole() -> None:
    both = "import sys\nsys.stdout.write('x' * 1000)\nsys.stderr.write('y' * 1000)"
    result = run_python(both, timeout_s=3, max_output_bytes=1000)
    assert (result.stdout, result.stderr) == ("x" * 1000, "y" * 1000)
    assert (result.ok, result.output_truncated, result.killed_by_signal) == (True, False, None)
    # the default cap is 1 MiB of each stream
    mib = run_python("import sys\nsys.stdout.write('x' * (1 << 20))", timeout_s=3)
    assert (len(mib.stdout), mib.ok, mib.output_truncated) == (1 << 20, True, False)
    over = run_python("import sys\nsys.stdout.write('x' * ((1 << 20) + 1))", timeout_s=3)
    assert (len(over.stdout), over.ok, over.output_truncated) == (1 << 20, False, True)


def test_a_program_posing_as_a_setup_failure_is_an_ordinary_failure() -> None:
    """Only exit status 121 together with the setup-failure message is the sandbox's fault."""
    message = f"import sys\nsys.stderr.write({SETUP_FAILED!r} + ' no')\nsys.exit(1)"
    posing = run_python(message, timeout_s=3)
    assert (posing.exit_code, posing.stderr) == (1, f"{SETUP_FAILED} no")
    status = run_python(f"import os\nos._exit({SETUP_FAILED_EXIT})", timeout_s=3)
    assert (status.exit_code, status.stderr) == (SETUP_FAILED_EXIT, "")
    # both, even on a line of their own after a guessed first line: the nonce is not known
    for lead in ("", "\\n", "0" * 32 + "\\n"):
        forged = f"{lead}{SETUP_FAILED} no"
        both = f"import os, sys\nsys.stderr.write({forged!r})\nsys.stderr.flush()\nos._exit(121)"
        posing = run_python(both, timeout_s=3)
        assert (posing.exit_code, posing.stderr) == (SETUP_FAILED_EXIT, forged)


def test_a_real_setup_failure_is_the_sandbox_s_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The child cannot apply a CPU limit of "soon": it exits before the program runs, and
    `run_python` raises with the child's message (not the nonce line before it)."""
    spawn = sandbox_module._spawn

    def broken(mode: str, scratch: str, identity: _Identity, config: dict[str, object]):
        return spawn(mode, scratch, identity, {**config, "cpu_s": "soon"})

    monkeypatch.setattr(sandbox_module, "_spawn", broken)
    with pytest.raises(SandboxError) as caught:
        run_python("print('ran')", timeout_s=3)
    assert str(caught.value) == (
        f"{SETUP_FAILED} ValueError: invalid literal for int() with base 10: 'soon'"
    )


# ------------------------------------------------------------------------------ who runs it


def test_identity_and_the_interpreter_check(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _Identity(0, 0).is_root and not _Identity(65534, 65534).is_root
    assert _Identity(None, None).is_root == (os.geteuid() == 0)
    assert sandbox_module._can_start_interpreter(_Identity(None, None)) is True
    monkeypatch.setattr(sys, "executable", "/bin/false")  # starts, but exits with 1
    assert sandbox_module._can_start_interpreter(_Identity(None, None)) is False


def test_a_root_trainer_runs_the_sandbox_as_nobody_when_it_can(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[_Identity] = []

    def can_start(identity: _Identity) -> bool:
        checked.append(identity)
        return True

    monkeypatch.setattr(sandbox_module, "_can_start_interpreter", can_start)
    nobody = _Identity(*sandbox_module._nobody())
    for euid, expected in ((0, nobody), (1, _Identity(None, None)), (1000, _Identity(None, None))):
        monkeypatch.setattr(sandbox_module, "_identity_cache", None)
        monkeypatch.setattr(sandbox_module.os, "geteuid", lambda euid=euid: euid)
        assert sandbox_module._sandbox_identity() == expected
    assert checked == [nobody]  # only the root trainer asks whether nobody can start it


def test_nobody_without_a_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_entry(name: str) -> None:
        raise KeyError(name)

    monkeypatch.setattr(sandbox_module.pwd, "getpwnam", no_entry)
    assert sandbox_module._nobody() == (65534, 65534)


# ------------------------------------------------------------------------------ time, CPU, memory


def test_infinite_loop_is_killed_at_the_wall_timeout(mode: str) -> None:
    start = time.monotonic()
    result = run_timed("while True:\n    pass", timeout_s=1, isolation=mode)
    assert time.monotonic() - start >= 1.0
    assert result.timed_out and result.exit_code is None
    assert result.killed_by_signal == signal.SIGKILL
    assert 1.0 <= result.wall_s < 1.0 + MARGIN_S


def test_a_program_that_closes_its_output_still_times_out(mode: str) -> None:
    # With no output left to read, the wait for its end keeps to the wall-clock deadline.
    program = "import os, time\nos.close(1)\nos.close(2)\ntime.sleep(0.7)"
    result = run_timed(program, timeout_s=0.3, isolation=mode)
    assert result.timed_out and result.exit_code is None
    assert result.killed_by_signal == signal.SIGKILL


def test_cpu_time_limit_ends_a_busy_program(mode: str) -> None:
    # SIGXCPU at 1 CPU second; PID 1 of a PID namespace ignores it and gets SIGKILL at 2.
    result = run_timed("while True:\n    pass", timeout_s=8, cpu_s=1, isolation=mode)
    assert not result.timed_out
    assert result.killed_by_signal in (signal.SIGXCPU, signal.SIGKILL)


FORK_BOMB = """
import os
import re
print(os.getcwd(), flush=True)
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_fork_bomb_is_contained(mode: str) -> None:
    result = run_timed(FORK_BOMB, timeout_s=2, isolation=mode, max_processes=16)
    assert result.timed_out and result.killed_by_signal == signal.SIGKILL
    assert_no_process_left(result.stdout.split()[0])


def test_process_count_is_capped(mode: str) -> None:
    program = (
        "import os, time\nstarted = 0\nfor _ in range(20):\n    try:\n"
        "        if os.fork() == 0:\n            time.sleep(5)\n            os._exit(0)\n"
        "        started += 1\n    except OSError:\n        pass\nprint(started)"
    )
    result = run_timed(program, timeout_s=3, isolation=mode, max_processes=8)
    started = int(result.stdout)
    if "no-fork" in isolation_report(mode):  # a root-owned sandbox: threads only
        assert started == 0
    else:  # itself and at most 7 children
        assert 0 < started <= 7


@pytest.mark.parametrize(
    "program",
    [
        "data = bytearray(4 * 1024**3)",
        "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))",
    ],
    ids=["one-allocation", "growing"],
)
def test_memory_bomb_fails_fast(mode: str, program: str) -> None:
    result = run_timed(program, timeout_s=3, isolation=mode, memory_mb=256)
    assert result.exit_code == 1 and not result.timed_out
    assert "MemoryError" in result.stderr


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_huge_output_is_capped_and_killed(mode: str, stream: str) -> None:
    program = f"import sys\nwhile True:\n    sys.{stream}.write('x' * 10000)"
    result = run_timed(program, timeout_s=3, isolation=mode, max_output_bytes=100_000)
    assert result.output_truncated and not result.timed_out and not result.ok
    assert len(getattr(result, stream)) == 100_000
    assert result.killed_by_signal == signal.SIGKILL


def test_file_size_limit(mode: str) -> None:
    program = "with open('big.bin', 'wb') as f:\n    f.write(b'x' * (3 * 1024 * 1024))"
    result = run_timed(program, timeout_s=3, isolation=mode, max_file_mb=1)
    # SIGXFSZ; PID 1 of a namespace ignores it, and its write fails (EFBIG or a full tmpfs)
    assert result.killed_by_signal == signal.SIGXFSZ or (
        result.exit_code == 1 and "OSError" in result.stderr
    )


# ------------------------------------------------------------------------------ files, secrets


WRITE_OUTSIDE = """
import os, sys
target, keep, outside_dir = sys.stdin.read().splitlines()
attempts = {
    "create": lambda: open(target, "w").write("pwned"),
    "overwrite": lambda: open(keep, "w").write("pwned"),
    "delete": lambda: os.remove(keep),
    "mkdir": lambda: os.mkdir(outside_dir),
}
for name, attempt in attempts.items():
    try:
        attempt()
        print(name, "WROTE")
    except OSError as exc:
        print(name, "blocked", type(exc).__name__)
with open("note.txt", "w") as note:
    note.write("kept in scratch")
print(open("note.txt").read())
print(os.getcwd())
"""


def test_writes_stay_in_the_scratch_dir(mode: str, tmp_path: Path) -> None:
    target, keep, outside_dir = tmp_path / "pwned.txt", tmp_path / "keep.txt", tmp_path / "dir"
    keep.write_text("original")
    stdin = f"{target}\n{keep}\n{outside_dir}\n"
    result = run_timed(WRITE_OUTSIDE, stdin, timeout_s=3, isolation=mode)
    lines = result.stdout.splitlines()
    assert [line.split()[:2] for line in lines[:4]] == [
        [name, "blocked"] for name in ("create", "overwrite", "delete", "mkdir")
    ]
    assert not target.exists() and not outside_dir.exists()
    assert keep.read_text() == "original"
    assert lines[4] == "kept in scratch"
    scratch = lines[5]
    assert Path(scratch).name.startswith("rlvr-sandbox-") and not Path(scratch).exists()


READ_SECRETS = """
import json, os
proc = {}
for pid in ("1", str(os.getppid())):
    try:
        proc[pid] = open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
    except OSError as exc:
        proc[pid] = type(exc).__name__
print(json.dumps({"environ": dict(os.environ), "proc": proc}))
"""


def test_environment_secrets_are_not_visible(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cr3t-token-6c1d2f"
    monkeypatch.setenv("RLVR_FAKE_API_KEY", secret)
    result = run_timed(READ_SECRETS, timeout_s=3, isolation=mode)
    assert result.exit_code == 0
    assert secret not in result.stdout and secret not in result.stderr
    seen = json.loads(result.stdout)
    assert set(seen["environ"]) == {"PATH", "HOME", "TMPDIR", "LANG"}


# ------------------------------------------------------------------------------ network

CONNECT = """
import socket, sys
tcp_port, udp_port, unix_path = sys.stdin.read().split()

def tcp():
    socket.create_connection(("127.0.0.1", int(tcp_port)), timeout=1)

def udp():
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"leak", ("127.0.0.1", int(udp_port)))

def unix():
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect(unix_path)

for attempt in (tcp, udp, unix):
    try:
        attempt()
        print(attempt.__name__, "CONNECTED")
    except OSError as exc:
        print(attempt.__name__, "blocked", type(exc).__name__)
"""


def test_network_is_blocked(mode: str, tmp_path: Path) -> None:
    with (
        socket.socket() as tcp,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp,
        socket.socket(socket.AF_UNIX) as unix,
    ):
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        unix.bind(str(tmp_path / "s"))
        unix.listen()
        stdin = f"{tcp.getsockname()[1]} {udp.getsockname()[1]} {tmp_path / 's'}"
        result = run_timed(CONNECT, stdin, timeout_s=3, isolation=mode)
        assert [line.split()[:2] for line in result.stdout.splitlines()] == [
            ["tcp", "blocked"],
            ["udp", "blocked"],
            ["unix", "blocked"],
        ]
        for listener in (tcp, udp, unix):
            listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            tcp.accept()
        with pytest.raises(TimeoutError):
            udp.recv(16)
        with pytest.raises(TimeoutError):
            unix.accept()


# ------------------------------------------------------------------------------ signals


def test_killing_its_parent_kills_only_the_sandbox(mode: str) -> None:
    program = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('survived')"
    result = run_timed(program, timeout_s=3, isolation=mode)
    # This test process, the trainer's stand-in, is still running: that is the point.
    if mode == "namespaces":
        # The parent is outside the PID namespace, so getppid() is 0 and kill(0) reaches only
        # the sandbox's own group, whose init (the program, PID 1) ignores signals sent from
        # inside its namespace: depending on the kernel the program dies or carries on.
        assert result.killed_by_signal == signal.SIGKILL or result.stdout == "survived\n"
    else:  # the kill is refused
        assert result.killed_by_signal == signal.SIGKILL or "PermissionError" in result.stderr
        assert "survived" not in result.stdout


def test_killing_its_own_group_or_pid_1_ends_only_the_sandbox(mode: str) -> None:
    group = run_timed(
        "import os, signal\nos.killpg(os.getpgrp(), signal.SIGKILL)\nprint('survived')",
        timeout_s=3,
        isolation=mode,
    )
    assert group.killed_by_signal == signal.SIGKILL or "PermissionError" in group.stderr
    if mode == "namespaces":  # pid 1 is the program itself; elsewhere see the SIGURG test
        init = run_timed(
            "import os, signal\nprint(os.getpid(), flush=True)\nos.kill(1, signal.SIGKILL)",
            timeout_s=3,
            isolation=mode,
        )
        assert init.stdout == "1\n"


SIGNAL_OUTSIDE = """
import os, signal, sys
for target in sys.stdin.read().split():
    try:
        os.kill(int(target), signal.SIGURG)
        print(target, "SENT")
    except OSError as exc:
        print(target, "refused", type(exc).__name__)
"""


def test_signals_do_not_leave_the_sandbox(mode: str, bystander: subprocess.Popen) -> None:
    # SIGURG is ignored by default, so a signal that escaped would harm no process.
    received: list[int] = []
    previous = signal.signal(signal.SIGURG, lambda number, _: received.append(number))
    try:
        targets = [os.getpid(), -os.getpgrp(), bystander.pid, -1]
        if mode != "namespaces":
            targets.append(1)
        stdin = " ".join(map(str, targets))
        result = run_timed(SIGNAL_OUTSIDE, stdin, timeout_s=3, isolation=mode)
        time.sleep(0.2)
    finally:
        signal.signal(signal.SIGURG, previous)
    outcomes = dict(line.split(maxsplit=1) for line in result.stdout.splitlines())
    assert set(outcomes) == set(map(str, targets))
    # kill(-1) reports success even when every process refused it; what counts is who got it
    assert all(outcomes[str(t)].startswith("refused") for t in targets if t != -1), outcomes
    assert received == []
    assert "got SIGURG" not in bystander_output(bystander)


def test_seccomp_alone_refuses_signals_to_other_processes(bystander: subprocess.Popen) -> None:
    """The seccomp fallback for kernels without Landlock signal scoping: ``kill`` only to its
    own process group, in a process with only that filter."""
    machine = seccomp_machine()
    if machine is None:
        pytest.skip("no seccomp filter for this architecture")
    script = f"""
import os, signal
from rlvr.rewards import _sandbox_child as child
child._prctl(38, 1)
child._install_seccomp(child.seccomp_program(
    {machine!r}, pid_namespace=False, signals_scoped=False, allow_fork=True))
got = []
signal.signal(signal.SIGURG, lambda *_: got.append(1))
os.kill(0, signal.SIGURG)
for target in ({bystander.pid}, os.getppid(), -1):
    try:
        os.kill(target, signal.SIGURG)
        print("SENT")
    except PermissionError:
        print("refused")
child_pid = os.fork()
if child_pid == 0:
    os._exit(7)
print("own group", len(got), "fork", os.waitstatus_to_exitcode(os.waitpid(child_pid, 0)[1]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True, text=True, timeout=30, start_new_session=True,
    )  # fmt: skip
    assert done.stdout.splitlines() == ["refused"] * 3 + ["own group 1 fork 7"], done.stderr
    assert "got SIGURG" not in bystander_output(bystander)
