"""Run model-written Python in a throw-away sandbox.

Backend ``bwrap`` (bubblewrap): read-only root, private size-capped /tmp and /dev/shm, home folders hidden,
new pid/net/ipc/uts namespaces (no network, loopback included; parent processes invisible), clean environment,
and, when started as root, a fresh unprivileged uid per program so that RLIMIT_NPROC really applies (root is
exempt from it) and nothing owned by root can be written or signalled.
Backend ``unshare`` (no bubblewrap, util-linux ``unshare``): the same containment from namespaces set up by
``sandbox_unshare``; PID 1 of the program's pid namespace ends with the program, and the kernel kills every
process left in it (no daemon survives).
Backend ``rlimit``: rlimits, clean environment, fresh temp cwd and a new session only; it contains nothing and is
used only when asked for explicitly (``MARS_BENCH_SANDBOX=rlimit`` or the task option ``sandbox_backend``).
``auto`` takes bwrap, else unshare, else refuses with one line (``SandboxUnavailable``).
``sandbox_status()`` lists what the chosen backend enforces here; each claim has a test (tests/test_tasks_sandbox.py).
"""
from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from mars_bench.tasks import sandbox_unshare

log = logging.getLogger("mars_bench.sandbox")

BACKENDS = ("auto", "bwrap", "unshare", "rlimit")
ENV_BACKEND = "MARS_BENCH_SANDBOX"   # an explicit user setting; wins over the task option sandbox_backend
INSTALL_HINT = ("install bubblewrap (apt-get install bubblewrap, dnf install bubblewrap, or pacman -S "
                "bubblewrap), or accept running model-written code uncontained (rlimits only) with "
                f"{ENV_BACKEND}=rlimit")


class SandboxUnavailable(ValueError):
    """No backend that contains model-written code works here. The message is one line."""

PATH_ENV = "/usr/local/bin:/usr/bin:/bin"
_UID_BASE = 0x30000          # per-program uids: 196608 + ...; no passwd entry needed
_uid_counter = itertools.count()
_lock = threading.Lock()
_probe_cache: dict[str, bool] = {}
_SYSTEM_TOP = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "proc", "sys", "dev", "run", "boot",
               "tmp", "var", "opt", "srv", "snap", "nix"}

# Inside the sandbox: set limits, drop to the per-run uid (when given), then run the program.
# argv: uid as cpu fsize nofile nproc mode program  (mode 'exec': replace self; 'spawn': child, so the
# program's parent is this launcher, never the harness)
_BOOT = r"""
import os, resource, sys
uid, lim_as, cpu, fsize, nofile, nproc = (int(x) for x in sys.argv[1:7])
mode, prog = sys.argv[7], sys.argv[8]
for r, v in ((resource.RLIMIT_AS, lim_as), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
             (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
    if v >= 0:
        resource.setrlimit(r, (v, v))
if uid >= 0 and os.getuid() != uid:
    os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
    with open('/proc/self/status') as f:
        eff = [ln.split()[1] for ln in f if ln.startswith('CapEff:')]
    if os.getuid() != uid or (eff and int(eff[0], 16)):
        sys.stderr.write('sandbox: could not drop privileges\n'); sys.exit(125)
cmd = [sys.executable, '-I', '-B', prog]
if mode == 'exec':
    os.execv(sys.executable, cmd)
import subprocess
sys.exit(subprocess.call(cmd))
"""


@dataclass
class SandboxResult:
    status: str            # 'passed' (exit 0) | 'failed' | 'timeout' | 'error' (sandbox itself failed)
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    backend: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _is_root() -> bool:
    return os.geteuid() == 0


def _python() -> tuple[str, Path]:
    """The interpreter that runs programs (the real binary behind a venv) and its install prefix."""
    exe = os.path.realpath(sys.executable)
    return exe, Path(os.path.realpath(sys.base_prefix))


def _world_accessible(path: str) -> bool:
    p = Path(path)
    for d in list(p.parents)[::-1]:
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(p).st_mode & stat.S_IROTH and os.stat(p).st_mode & stat.S_IXOTH)


def _hidden_dirs() -> list[str]:
    homes = set()
    try:
        import pwd

        homes.add(pwd.getpwuid(os.getuid()).pw_dir)
    except (KeyError, ImportError):
        pass
    if os.environ.get("HOME"):
        homes.add(os.environ["HOME"])
    out = []
    for h in sorted(homes):
        r = os.path.realpath(h)
        parts = Path(r).parts
        # never hide the system itself (daemon users may have homes like /var/lib/x or /usr/...)
        if len(parts) >= 2 and parts[1] not in _SYSTEM_TOP and os.path.isdir(r):
            out.append(r)
    return out


def _uids_in_use() -> dict[int, list[int]]:
    procs: dict[int, list[int]] = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                for ln in f:
                    if ln.startswith("Uid:"):
                        procs.setdefault(int(ln.split()[1]), []).append(int(pid))
                        break
        except OSError:
            continue
    return procs


def _new_uid() -> int:
    in_use = _uids_in_use()
    with _lock:
        while True:
            uid = _UID_BASE + (os.getpid() % 4096) * 64 + next(_uid_counter) % 64
            if uid not in in_use:
                return uid


def _kill_uid(uid: int, wait_s: float = 5.0) -> None:
    """SIGKILL every process of the per-run uid, until none is left (namespace teardown is asynchronous)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = _uids_in_use().get(uid, [])
        if not pids or time.monotonic() > deadline:
            if pids:
                log.warning("sandbox uid %d still has %d processes after %.0f s", uid, len(pids), wait_s)
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)


def _bwrap_argv(exe: str, prefix: Path, prog_host: str, tmpfs_mb: int) -> list[str]:
    a = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
         "--perms", "1777", "--size", str(tmpfs_mb << 20), "--tmpfs", "/tmp",
         "--perms", "0777", "--dir", "/tmp/w",
         "--perms", "1777", "--size", str(16 << 20), "--tmpfs", "/dev/shm"]
    masked = ["/tmp"]
    for h in _hidden_dirs():
        a += ["--perms", "0755", "--tmpfs", h]
        masked.append(h)
    for m in masked:   # the interpreter lives under a hidden folder: put it back, read-only
        if str(prefix).startswith(m.rstrip("/") + "/"):
            rel = Path(prefix).relative_to(m).parts
            for i in range(1, len(rel)):
                a += ["--perms", "0755", "--dir", str(Path(m, *rel[:i]))]
            a += ["--ro-bind", str(prefix), str(prefix)]
            break
    a += ["--ro-bind", prog_host, "/tmp/w/prog.py",
          "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
          "--die-with-parent", "--new-session", "--clearenv",
          "--setenv", "PATH", PATH_ENV, "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/tmp/w",
          "--chdir", "/tmp/w"]
    if _is_root():
        a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        a += ["--unshare-user"]
    return a + [exe]


def _probe(backend: str) -> bool:
    """True when ``backend`` runs a trivial program here (cached per process)."""
    with _lock:
        if backend in _probe_cache:
            return _probe_cache[backend]
    ok = False
    if shutil.which(backend):
        try:
            r = _run("import os; print('ok')", backend=backend, timeout_s=30.0)
            ok = r.status == "passed" and r.stdout.strip() == "ok"
            if not ok:
                log.warning("%s is installed but failed its probe: %s", backend, r.stderr.strip()[-300:])
        except OSError as e:
            log.warning("%s probe failed: %s", backend, e)
    with _lock:
        _probe_cache[backend] = ok
    return ok


def choose_backend(requested: str | None = None, *, usable=None) -> str:
    """The backend to use: ``$MARS_BENCH_SANDBOX``, else ``requested``, else auto (bwrap, then unshare).

    ``usable``: name -> bool, to force what is available (tests); by default each backend is probed once.
    Raises ``SandboxUnavailable`` (one line) when nothing that contains the program works."""
    requested = os.environ.get(ENV_BACKEND) or requested or "auto"
    if requested not in BACKENDS:
        raise SandboxUnavailable(f"sandbox backend {requested!r}; allowed: {', '.join(BACKENDS)}")
    works = (lambda b: _probe(b)) if usable is None else (lambda b: bool(usable.get(b)))
    if requested == "rlimit":
        _warn_uncontained()
        return "rlimit"
    for b in (("bwrap", "unshare") if requested == "auto" else (requested,)):
        if works(b):
            return b
    what = "bubblewrap is missing or unusable and unshare namespaces are not permitted here" \
        if requested == "auto" else f"sandbox backend {requested!r} is missing or does not work here"
    raise SandboxUnavailable(f"HumanEval refuses to run model-written code: {what}; {INSTALL_HINT}")


def _warn_uncontained() -> None:
    with _lock:
        warned = _probe_cache.get("warned", False)
        _probe_cache["warned"] = True
    if warned:
        return
    msg = ("SANDBOX NOT CONTAINED (sandbox backend rlimit, chosen explicitly): model-written code runs with rlimits, "
           "a clean environment and a temp cwd only - it can write files, use the network and leave processes.")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    log.warning(msg)


# What each backend enforces. Every name here is checked by a test in tests/test_tasks_sandbox.py.
_COMMON = ["wall_timeout", "rlimit_cpu", "rlimit_as_memory", "rlimit_fsize", "rlimit_nofile",
           "clean_env(PATH,LANG,HOME=tempdir)", "fresh_temp_cwd_removed_after"]
_CONTAINED = ["readonly_root_fs", "private_tmp_tmpfs_capped", "home_dirs_hidden", "no_network(net_namespace)",
              "pid_namespace(parent_invisible)", "no_process_outlives_the_program"]


def sandbox_status(backend: str | None = None, *, usable=None) -> dict:
    """What the chosen backend enforces on this machine (recorded in run summaries)."""
    b = choose_backend(backend, usable=usable)
    root = _is_root()
    if b in ("bwrap", "unshare"):
        enforced = _COMMON + _CONTAINED
        enforced += ["rlimit_nproc(per-run unprivileged uid)", "unprivileged_uid"] if root else \
            ["rlimit_nproc(approximate: counts this user's processes)"]
        not_enforced = ["seccomp_syscall_filter", "disk_io_and_cpu_share_limits"]
    else:
        uid_ok = root and _world_accessible(_python()[0])
        enforced = _COMMON + (["rlimit_nproc(per-run unprivileged uid)", "unprivileged_uid"] if uid_ok else [])
        not_enforced = _CONTAINED + ["seccomp_syscall_filter"] + ([] if uid_ok else ["rlimit_nproc", "unprivileged_uid"])
    return {"backend": b, "enforced": enforced, "not_enforced": not_enforced, "bwrap": shutil.which("bwrap"),
            "unshare": shutil.which("unshare")}


def run_python(source: str, *, timeout_s: float = 10.0, memory_mb: int = 1024, max_procs: int = 64,
               cpu_s: float | None = None, tmpfs_mb: int = 64, backend: str | None = None) -> SandboxResult:
    """Run ``source`` as a Python program; status 'passed' iff it exits 0 within ``timeout_s``."""
    return _run(source, backend=choose_backend(backend), timeout_s=timeout_s, memory_mb=memory_mb,
                max_procs=max_procs, cpu_s=cpu_s, tmpfs_mb=tmpfs_mb)


def _user_procs() -> int:
    return len(_uids_in_use().get(os.getuid(), []))


def _run(source: str, *, backend: str, timeout_s: float, memory_mb: int = 1024, max_procs: int = 64,
         cpu_s: float | None = None, tmpfs_mb: int = 64) -> SandboxResult:
    exe, prefix = _python()
    root = _is_root()
    host = tempfile.mkdtemp(prefix="mars-sbx-")
    uid = -1
    t0 = time.monotonic()
    try:
        prog = os.path.join(host, "prog.py")
        with open(prog, "w", encoding="utf-8") as f:
            f.write(source)
        os.chmod(host, 0o755)
        os.chmod(prog, 0o644)
        cpu = int(math.ceil(cpu_s if cpu_s is not None else timeout_s)) + 1
        own_uid = root and (backend in ("bwrap", "unshare") or _world_accessible(exe))
        nproc = max_procs if own_uid else _user_procs() + max_procs
        if own_uid:
            uid = _new_uid()
        limits = [str(uid), str(memory_mb << 20), str(cpu), str(16 << 20), "256", str(nproc)]
        if backend == "bwrap":
            argv = _bwrap_argv(exe, prefix, prog, tmpfs_mb) + ["-I", "-c", _BOOT] + limits + ["exec", "prog.py"]
            env, cwd = {"PATH": PATH_ENV, "LANG": "C.UTF-8"}, host
        elif backend == "unshare":
            argv = sandbox_unshare.argv(exe, root) + limits + [prog, str(tmpfs_mb), str(prefix)] + _hidden_dirs()
            env, cwd = {"PATH": PATH_ENV, "LANG": "C.UTF-8"}, host
        else:
            if uid >= 0:
                os.chown(host, uid, uid)
            argv = [exe, "-I", "-c", _BOOT] + limits + ["spawn", prog]
            env, cwd = {"PATH": PATH_ENV, "LANG": "C.UTF-8", "HOME": host, "TMPDIR": host}, host
        out_path, err_path = os.path.join(host, ".stdout"), os.path.join(host, ".stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd,
                                    start_new_session=True, close_fds=True)
            timed_out = False
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_tree(proc, uid)
                rc = proc.wait()
        _kill_tree(proc, uid)   # anything left behind (a daemonised child in the rlimit backend)
        stdout, stderr = _tail(out_path), _tail(err_path)
    finally:
        shutil.rmtree(host, ignore_errors=True)
    wall = time.monotonic() - t0
    if timed_out:
        status = "timeout"
    elif rc == 0:
        status = "passed"
    elif rc == 125 or (backend == "bwrap" and rc == 1 and stderr.startswith("bwrap:")) or \
            (backend == "unshare" and rc == 1 and stderr.startswith("unshare:")):
        status = "error"
    else:
        status = "failed"
    return SandboxResult(status, rc, stdout, stderr, wall, backend)


def _kill_tree(proc: subprocess.Popen, uid: int) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if uid >= 0:
        _kill_uid(uid)


def _tail(path: str, limit: int = 8000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
