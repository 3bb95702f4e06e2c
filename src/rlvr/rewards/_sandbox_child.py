"""The process inside the code sandbox: it confines itself, then runs the untrusted program.

`rlvr.rewards.sandbox` starts it as ``python -I -S -c <this file's text> key=value ...``, so it
imports only the standard library: it runs without site-packages, and every import costs
start-up time on every test case. In order, it

1. reads the program from the scratch directory and deletes the file, so the program cannot
   read its own test cases back from disk;
2. ``namespaces``: enters new user (its uid mapped to 0), mount, network and PID namespaces and
   forks; this process stays outside the PID namespace, waits and exits as its child did, and
   the child goes on as PID 1 (killed if this process dies). The child mounts a fresh ``/proc``,
   makes every mount read-only (``mount_setattr``, recursive) and mounts a size-capped tmpfs on
   the scratch directory. Other modes: a Landlock ruleset, where the kernel has Landlock,
   allows writes only beneath the scratch directory, hides ``/proc`` and (ABI ≥ 6) keeps
   signals and abstract Unix sockets inside the sandbox;
3. sets no-new-privileges, drops every capability and sets the resource limits;
4. installs a seccomp filter (x86-64 and arm64), or else an audit hook;
5. runs the program in this same process as ``__main__``.

A setup failure exits with `SETUP_FAILED_EXIT`, and writes to stderr the run's ``nonce``
setting on a line of its own, then a message that starts with `SETUP_FAILED`: the program, which
never learns the nonce, cannot pass its own failure off as the sandbox's.
"""

import ctypes
import os
import resource
import signal
import stat
import struct
import sys

SETUP_FAILED = "rlvr-sandbox: setup failed:"
SETUP_FAILED_EXIT = 121

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# --------------------------------------------------------------------------- helpers


def _check(result: int, what: str) -> int:
    """`result` of a libc call, or OSError with errno when it failed."""
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
    return result


def _prctl(option: int, arg: int = 0) -> int:
    zero = ctypes.c_ulong(0)
    return _libc.prctl(ctypes.c_int(option), ctypes.c_ulong(arg), zero, zero, zero)


# --------------------------------------------------------------------------- namespaces

_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x20000, 0x10000000, 0x20000000, 0x40000000
)  # fmt: skip
_PR_SET_PDEATHSIG = 1
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000


def _exit_like(status: int) -> None:
    """End this process the way a child with wait status `status` ended."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal that does not end a process
    os._exit(code)


def _enter_namespaces() -> None:
    """New user, mount, network and PID namespaces; returns in the child, PID 1 of the latter."""
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as file:
            file.write(text)
    _check(_libc.mount(None, b"/", None, ctypes.c_ulong(_MS_REC | _MS_PRIVATE), None), "mounts")
    child = os.fork()
    if child:
        _exit_like(os.waitpid(child, 0)[1])
    _check(_prctl(_PR_SET_PDEATHSIG, signal.SIGKILL), "pdeathsig")
    proc_flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    _check(_libc.mount(b"proc", b"/proc", b"proc", proc_flags, None), "mount /proc")


# --------------------------------------------------------------------------- filesystem

_AT_FDCWD = -100
_AT_RECURSIVE = 0x8000
_MOUNT_ATTR_RDONLY = 0x1
_SYS_MOUNT_SETATTR = 442


def _read_only_root_and_tmpfs_scratch(scratch: str, size_mb: int) -> None:
    """Every mount read-only, recursively; a fresh tmpfs of `size_mb` MiB on `scratch`."""
    attr = struct.pack("QQQQ", _MOUNT_ATTR_RDONLY, 0, 0, 0)
    dfd, flags = ctypes.c_int(_AT_FDCWD), ctypes.c_uint(_AT_RECURSIVE)
    size = ctypes.c_size_t(len(attr))
    _check(_libc.syscall(_SYS_MOUNT_SETATTR, dfd, b"/", flags, attr, size), "read-only /")
    options = f"size={size_mb}m,nr_inodes=4096,mode=700".encode()
    mount_flags = ctypes.c_ulong(_MS_NOSUID | _MS_NODEV)
    _check(_libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", mount_flags, options), "tmpfs")
    os.chdir(scratch)  # the old working directory is the directory under the new tmpfs


_SYS_LANDLOCK = {"create": 444, "add_rule": 445, "restrict_self": 446}
_LL_READ = (1 << 2) | (1 << 3)  # READ_FILE, READ_DIR
_LL_WRITE = (1 << 1) | sum(1 << bit for bit in range(4, 13))  # WRITE_FILE, REMOVE_*, MAKE_*
_LL_FILE_RIGHTS = 0b1100000000000111  # EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV
_LL_SCOPE_ALL = 0b11  # abstract Unix sockets and signals stay inside the sandbox


def _landlock_allow(ruleset: int, path: str, access: int) -> None:
    """Allow `access` beneath `path` (a file gets only the rights a file can have)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:  # a dangling symlink in /
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _LL_FILE_RIGHTS
        rule = struct.pack("=Qi", access, fd)
        _check(_libc.syscall(_SYS_LANDLOCK["add_rule"], ruleset, 1, rule, 0), f"rule {path}")
    finally:
        os.close(fd)


def _landlock(scratch: str) -> list[str]:
    """Writes only beneath `scratch` (and to /dev/null), reads anywhere but /proc; [] if absent."""
    abi = _libc.syscall(_SYS_LANDLOCK["create"], None, 0, 1)
    if abi < 1:
        return []
    handled = _LL_READ | _LL_WRITE | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    scoped = _LL_SCOPE_ALL if abi >= 6 else 0
    attr = struct.pack("QQQ", handled, 0, scoped)[: 8 if abi < 4 else 16 if abi < 6 else 24]
    ruleset = _check(_libc.syscall(_SYS_LANDLOCK["create"], attr, len(attr), 0), "landlock")
    try:
        for name in os.listdir("/"):
            if name != "proc":
                _landlock_allow(ruleset, "/" + name, _LL_READ)
        _landlock_allow(ruleset, scratch, handled)
        _landlock_allow(ruleset, "/dev/null", handled)
        _check(_libc.syscall(_SYS_LANDLOCK["restrict_self"], ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return [f"landlock-abi{abi}"] + (["signals-scoped"] if scoped else [])


# --------------------------------------------------------------------------- privileges, limits

_PR_SET_NO_NEW_PRIVS = 38
_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522


def _drop_privileges() -> None:
    """No new privileges on exec; empty bounding, effective, permitted and inheritable sets."""
    _check(_prctl(_PR_SET_NO_NEW_PRIVS, 1), "no_new_privs")
    for capability in range(64):  # stops at the first unknown one, or at once without CAP_SETPCAP
        if _prctl(_PR_CAPBSET_DROP, capability) < 0:
            break
    header = struct.pack("Ii", _CAPABILITY_VERSION_3, 0)
    _check(_libc.capset(header, bytes(24)), "capset")


def _tasks_of_uid(uid: int) -> int:
    """Processes and threads of real user `uid` now (what RLIMIT_NPROC counts outside a userns)."""
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
        except OSError:  # the process is gone
            continue
        if int(fields["Uid"].split()[0]) == uid:
            count += int(fields["Threads"])
    return count


def _lower_limit(which: int, value: int) -> None:
    """Set soft and hard limit `which` to `value`, or to the current hard limit if lower."""
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def _set_limits(cpu_s: int, memory_mb: int, max_file_mb: int, nproc: int) -> None:
    """CPU seconds (SIGXCPU, SIGKILL one second later), address space, file size, no core dumps."""
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    cpu_hard = cpu_s + 1 if hard == resource.RLIM_INFINITY else min(cpu_s + 1, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (min(cpu_s, cpu_hard), cpu_hard))
    _lower_limit(resource.RLIMIT_AS, memory_mb << 20)
    _lower_limit(resource.RLIMIT_FSIZE, max_file_mb << 20)
    _lower_limit(resource.RLIMIT_CORE, 0)
    _lower_limit(resource.RLIMIT_NPROC, nproc)


# --------------------------------------------------------------------------- seccomp

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_SYSCALLS = {
    "x86_64": {
        "socket": 41, "ptrace": 101, "setpgid": 109, "setsid": 112, "kill": 62, "tkill": 200,
        "tgkill": 234, "process_vm_readv": 310, "process_vm_writev": 311, "fork": 57,
        "vfork": 58, "clone": 56,
    },
    "aarch64": {
        "socket": 198, "ptrace": 117, "setpgid": 154, "setsid": 157, "kill": 129, "tkill": 130,
        "tgkill": 131, "process_vm_readv": 270, "process_vm_writev": 271, "clone": 220,
    },
}  # fmt: skip
_COMMON_SYSCALLS = {
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "pidfd_open": 434,
    "clone3": 435, "pidfd_getfd": 438,
}  # fmt: skip
_LD_W_ABS, _JEQ, _JGE, _JSET, _JA, _RET = 0x20, 0x15, 0x35, 0x45, 0x05, 0x06
_ALLOW, _KILL_PROCESS = 0x7FFF0000, 0x80000000
_EPERM, _EAGAIN, _EACCES, _ENOSYS = 1, 11, 13, 38
_X32_SYSCALL_BIT = 0x40000000
_CLONE_THREAD = 0x10000
_ARG0 = 16  # offset of the low 32 bits of args[0] in struct seccomp_data (little-endian)


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def _deny(nr: int, errno: int) -> list[bytes]:
    """Syscall `nr` fails with `errno`."""
    return [_insn(_JEQ, nr, 0, 1), _insn(_RET, 0x50000 | errno)]


def _deny_if_arg0(nr: int, tests: list[tuple[int, int, bool]], errno: int) -> list[bytes]:
    """Syscall `nr` fails with `errno` when any ``(op, k, deny_when)`` test of args[0] says so."""
    n = len(tests)
    block = [_insn(_JEQ, nr, 0, n + 4), _insn(_LD_W_ABS, _ARG0)]
    for i, (op, k, deny_when) in enumerate(tests):
        jump = n + 1 - i  # to the final RET of this block
        block.append(_insn(op, k, jump, 0) if deny_when else _insn(op, k, 0, jump))
    return [*block, _insn(_LD_W_ABS, 0), _insn(_JA, 1), _insn(_RET, 0x50000 | errno)]


def seccomp_program(
    machine: str, *, pid_namespace: bool, signals_scoped: bool, allow_fork: bool
) -> bytes:
    """The BPF program: no sockets (socketpair stays), no io_uring; another architecture's
    syscalls kill the process.

    Without a PID namespace: no setsid/setpgid (so a final group kill reaches everything), no
    ptrace, process_vm_*, pidfd_open or pidfd_getfd; unless Landlock already keeps signals
    inside (`signals_scoped`), ``kill`` only to its own process group (target 0) and no
    tkill/tgkill. Without `allow_fork`: new threads, no new processes.
    """
    calls = {**_SYSCALLS[machine], **_COMMON_SYSCALLS}
    program = [
        _insn(_LD_W_ABS, 4),
        _insn(_JEQ, _AUDIT_ARCH[machine], 1, 0),
        _insn(_RET, _KILL_PROCESS),
        _insn(_LD_W_ABS, 0),
    ]
    if machine == "x86_64":  # x32 syscall numbers
        program += [_insn(_JGE, _X32_SYSCALL_BIT, 0, 1), _insn(_RET, 0x50000 | _ENOSYS)]
    program += _deny(calls["socket"], _EACCES)
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        program += _deny(calls[name], _ENOSYS)
    if not pid_namespace:
        for name in ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_open",
                     "pidfd_getfd", "setsid", "setpgid"):  # fmt: skip
            program += _deny(calls[name], _EPERM)
        if not signals_scoped:
            program += _deny_if_arg0(calls["kill"], [(_JEQ, 0, False)], _EPERM)
            program += _deny(calls["tkill"], _EPERM) + _deny(calls["tgkill"], _EPERM)
    if not allow_fork:
        program += _deny(calls["clone3"], _ENOSYS)  # the C library falls back to clone
        program += _deny_if_arg0(calls["clone"], [(_JSET, _CLONE_THREAD, False)], _EAGAIN)
        for name in ("fork", "vfork"):
            if name in calls:
                program += _deny(calls[name], _EAGAIN)
    return b"".join([*program, _insn(_RET, _ALLOW)])


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def _install_seccomp(program: bytes) -> None:
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))
    zero = ctypes.c_ulong(0)
    result = _libc.prctl(ctypes.c_int(22), ctypes.c_ulong(2), ctypes.byref(fprog), zero, zero)
    _check(result, "seccomp")


def seccomp_machine() -> str | None:
    """The architecture name `seccomp_program` knows for this process, or None."""
    machine = os.uname().machine
    return machine if machine in _AUDIT_ARCH and sys.maxsize > 2**32 else None


# --------------------------------------------------------------------------- audit hook

_BLOCKED_EVENTS = frozenset({
    "socket.__new__", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
    "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.forkpty", "subprocess.Popen",
    "os.killpg",
})  # fmt: skip
_PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1), "os.link": (1,),
    "os.symlink": (1,), "os.truncate": (0,), "os.chmod": (0,), "os.chown": (0,), "os.utime": (0,),
}  # fmt: skip
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _install_audit_hook(scratch: str, allow_fork: bool) -> None:
    """Best effort inside the process: no sockets, ctypes or new programs; signals only to the
    own process or group; writes only beneath `scratch`; no /proc of other processes; no fork
    unless `allow_fork`."""
    blocked_events = _BLOCKED_EVENTS if allow_fork else _BLOCKED_EVENTS | {"os.fork"}

    def inside(path: object) -> bool:
        if not isinstance(path, (str, bytes)):
            return True  # a file descriptor, opened under this hook
        real = os.path.realpath(os.fsdecode(path))
        return real == scratch or real.startswith(scratch + "/")

    def hook(event: str, args: tuple) -> None:
        blocked = event in blocked_events
        if event == "os.kill":
            blocked = args[0] not in (0, os.getpid())
        elif event in _PATH_EVENTS:
            blocked = not all(inside(args[i]) for i in _PATH_EVENTS[event])
        elif event == "open" and isinstance(args[0], (str, bytes)) and isinstance(args[2], int):
            real = os.path.realpath(os.fsdecode(args[0]))
            own = f"/proc/{os.getpid()}"
            other_proc = (
                real.startswith("/proc/") and real != own and not real.startswith(own + "/")
            )
            blocked = other_proc or (bool(args[2] & _WRITE_FLAGS) and not inside(real))
        if blocked:
            raise PermissionError(f"{event} is blocked in the sandbox")

    sys.addaudithook(hook)


# --------------------------------------------------------------------------- main


def _confine(config: dict[str, str]) -> list[str]:
    """Apply every isolation step of `config["mode"]`; the names of the mechanisms in force."""
    mode, scratch = config["mode"], config["scratch"]
    root, max_processes = config["root"] == "1", int(config["max_processes"])
    held: list[str] = []
    if mode == "namespaces":
        _enter_namespaces()
        _read_only_root_and_tmpfs_scratch(scratch, int(config["max_file_mb"]))
        held += ["user+pid+net+mount-namespaces", "read-only-root", "tmpfs-scratch"]
        nproc = max_processes + 1  # counted in the user namespace, the waiting parent included
        _drop_privileges()
    else:
        nproc = _tasks_of_uid(os.getuid()) + max_processes - 1  # counted for the whole uid
        _drop_privileges()  # before Landlock, which needs no_new_privs
        held += _landlock(scratch)
    _set_limits(int(config["cpu_s"]), int(config["memory_mb"]), int(config["max_file_mb"]), nproc)
    held.append("rlimits" if not root else "rlimits-no-nproc")
    machine = seccomp_machine()
    if mode == "audit-hook":
        _install_audit_hook(scratch, allow_fork=not root)
        held.append("audit-hook" if not root else "audit-hook-no-fork")
    elif machine is None:
        raise OSError(f"no seccomp filter for {os.uname().machine}")
    else:  # Linux does not enforce RLIMIT_NPROC for root: no child processes at all then
        program = seccomp_program(
            machine,
            pid_namespace=mode == "namespaces",
            signals_scoped="signals-scoped" in held,
            allow_fork=not root,
        )
        _install_seccomp(program)
        held.append("seccomp" if not root else "seccomp-no-fork")
    return held


def _run_program(source: str, filename: str) -> None:
    """Run `source` as the ``__main__`` module of this process."""
    module = type(sys)("__main__")
    module.__file__ = filename
    sys.modules["__main__"] = module
    sys.argv = [filename]
    exec(compile(source, filename, "exec"), module.__dict__)


def main() -> None:
    config = dict(argument.split("=", 1) for argument in sys.argv[1:])
    nonce = config.pop("nonce", "")
    source = ""
    try:
        if config["program"]:
            path = os.path.join(config["scratch"], config["program"])
            with open(path, encoding="utf-8") as file:
                source = file.read()
            os.remove(path)
        held = _confine(config)
    except Exception as exc:
        sys.stderr.write(f"{nonce}\n{SETUP_FAILED} {type(exc).__name__}: {exc}\n")
        sys.stderr.flush()
        os._exit(SETUP_FAILED_EXIT)
    if not config["program"]:
        print(" ".join(held), flush=True)
        return
    del nonce  # not left in this frame for the program to read
    _run_program(source, config["program"])


if __name__ == "__main__":
    main()
