"""The ``unshare`` sandbox backend: containment without bubblewrap, from util-linux ``unshare`` (>= 2.32).

The program runs in its own pid, net, mount, ipc and uts namespaces (``unshare --pid --fork --kill-child
--mount-proc --net --ipc --uts``; an unprivileged harness adds ``--user --map-root-user``). Inside, the launcher
below is PID 1 of the new pid namespace, and:
  * remounts every mount read-only, then mounts a fresh size-capped tmpfs on /tmp and /dev/shm and an empty
    read-only tmpfs over each home folder (the interpreter's prefix is bound back read-only when it lives there);
    every remaining mount is checked to be read-only, else it refuses (exit 125, status 'error');
  * forks the program with rlimits, a clean environment and, when the harness is root, a fresh unprivileged uid;
  * exits when the program exits. The kernel then SIGKILLs every process left in the pid namespace: a
    double-forked ``setsid`` daemon does not survive the program. When the harness kills ``unshare`` (wall
    timeout), ``--kill-child`` kills PID 1 and with it the namespace.
The net namespace has only a loopback interface that is down: no connection, loopback included.
"""
from __future__ import annotations

# argv: uid as cpu fsize nofile nproc prog_host tmpfs_mb prefix [hidden...]
BOOT = r"""
import ctypes, os, re, resource, sys
uid, lim_as, cpu, fsize, nofile, nproc = (int(x) for x in sys.argv[1:7])
prog_host, tmpfs_mb, prefix = sys.argv[7], int(sys.argv[8]), sys.argv[9]
hidden = sys.argv[10:]
libc = ctypes.CDLL(None, use_errno=True)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
ATIME = {"noatime": 1024, "nodiratime": 2048, "relatime": 1 << 21}
FLAGS = {"nosuid": NOSUID, "nodev": NODEV, "noexec": NOEXEC, **ATIME}

def mount(src, tgt, fs, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(tgt), enc(fs), ctypes.c_ulong(flags), enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {tgt}: {os.strerror(e)}")

def mounts():
    out = []
    with open("/proc/self/mountinfo") as f:
        for ln in f:
            p = ln.split()
            mp = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p[4])
            opts = p[5].split(",")
            fl = sum(FLAGS.get(o, 0) for o in opts)
            out.append((mp, fl if any(o in ATIME for o in opts) else fl | (1 << 24)))
    return out

def fail(msg):
    sys.stderr.write("sandbox: " + msg + "\n")
    sys.exit(125)

try:
    with open(prog_host, "rb") as f:
        source = f.read()
    keep = os.open(prefix, os.O_RDONLY | os.O_DIRECTORY)
    mount(None, "/", None, REC | PRIVATE)
    table = mounts()
    for mp, fl in table:
        if os.path.isdir(mp) or os.path.exists(mp):
            mount(None, mp, None, REMOUNT | BIND | RDONLY | fl)
    mount("tmpfs", "/tmp", "tmpfs", NOSUID | NODEV, f"size={tmpfs_mb}m,mode=1777")
    if os.path.isdir("/dev/shm"):
        mount("tmpfs", "/dev/shm", "tmpfs", NOSUID | NODEV, "size=16m,mode=1777")
    root_fl = dict(table).get("/", 0)
    for h in ["/tmp"] + hidden:   # masked folders; the interpreter is bound back when it lives in one
        if h != "/tmp":
            mount("tmpfs", h, "tmpfs", NOSUID | NODEV, "size=1m,mode=0755")
        if prefix.startswith(h.rstrip("/") + "/"):
            os.umask(0o022)
            os.makedirs(prefix, mode=0o755, exist_ok=True)
            mount(f"/proc/self/fd/{keep}", prefix, None, BIND | REC)
            mount(None, prefix, None, REMOUNT | BIND | RDONLY | root_fl)
        if h != "/tmp":
            mount(None, h, None, REMOUNT | RDONLY | NOSUID | NODEV)
    os.close(keep)
    os.mkdir("/tmp/w", 0o777)
    os.chmod("/tmp/w", 0o777)
    with open("/tmp/w/prog.py", "wb") as f:
        f.write(source)
    for mp, _ in mounts():
        if mp not in ("/tmp", "/dev/shm") and os.path.exists(mp) and not os.statvfs(mp).f_flag & os.ST_RDONLY:
            fail(f"{mp} is still writable")
except OSError as e:
    fail(str(e))

pid = os.fork()
if pid == 0:
    try:
        for r, v in ((resource.RLIMIT_AS, lim_as), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_FSIZE, fsize),
                     (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc)):
            if v >= 0:
                resource.setrlimit(r, (v, v))
        if uid >= 0:
            os.setgroups([]); os.setresgid(uid, uid, uid); os.setresuid(uid, uid, uid)
            if os.getuid() != uid:
                raise OSError("could not drop privileges")
        os.chdir("/tmp/w")
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/w", "TMPDIR": "/tmp"}
        os.execve(sys.executable, [sys.executable, "-I", "-B", "prog.py"], env)
    except BaseException as e:
        sys.stderr.write(f"sandbox: {e}\n")
        os._exit(125)
while True:
    w, status = os.waitpid(-1, 0)   # PID 1 also reaps orphans; only the program's end matters
    if w == pid:
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
"""


def argv(exe: str, is_root: bool) -> list[str]:
    """The ``unshare`` command line that starts ``BOOT`` as PID 1 of fresh namespaces."""
    a = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--uts",
         "--propagation", "private"]
    if not is_root:
        a += ["--user", "--map-root-user"]
    return a + [exe, "-I", "-S", "-c", BOOT]
