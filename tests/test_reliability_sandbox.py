"""``sandbox_status`` claims only what is enforced: every claim of every backend usable here is attacked by a
program that exits 0 only if the attack worked, and the effect is checked from outside too.

The ``unshare`` backend is the fallback without bubblewrap; it is forced by its setting, not by uninstalling bwrap.
"""
import os
import pwd
import random
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from mars_bench.tasks import sandbox as S

BACKENDS = [b for b in ("bwrap", "unshare", "rlimit") if b == "rlimit" or S._probe(b)]


def _run(backend, code, **kw):
    kw.setdefault("timeout_s", 5)
    return S.run_python(code, backend=backend, **kw)


def _attack_fails(backend, code, **kw):
    r = _run(backend, code, **kw)
    assert not r.passed, (backend, r)
    return r


def check_wall_timeout(b):
    r = _run(b, "while True: pass", timeout_s=1.5)
    assert r.status == "timeout" and r.wall_s < 6


def check_rlimit_cpu(b):
    r = _run(b, "while True: pass", timeout_s=30, cpu_s=1)
    assert r.status == "failed" and r.wall_s < 20       # killed by the CPU limit, not the wall timeout


def check_rlimit_as_memory(b):
    r = _attack_fails(b, "a = []\nwhile True:\n    a.append(bytearray(10**7))", memory_mb=256, timeout_s=20)
    assert "MemoryError" in r.stderr


def check_rlimit_fsize(b):
    _attack_fails(b, "open('big', 'wb').write(b'x' * (17 << 20))")     # 16 MiB per file


def check_rlimit_nofile(b):
    _attack_fails(b, "fs = [open('/dev/null') for _ in range(300)]")   # 256 descriptors


def check_clean_env(b):
    os.environ["MARS_SECRET_TEST"] = "s3cr3t"
    try:
        r = _run(b, "import os, json; print(json.dumps(sorted(os.environ)))")
    finally:
        del os.environ["MARS_SECRET_TEST"]
    assert r.passed and "MARS_SECRET_TEST" not in r.stdout
    assert set(eval(r.stdout)) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD", "LC_CTYPE"}


def check_fresh_temp_cwd(b):
    before = set(Path(tempfile.gettempdir()).glob("mars-sbx-*"))
    r = _run(b, "import os; open('mine', 'w').write('x'); print(sorted(os.listdir('.')))")
    assert r.passed and "'mine'" in r.stdout and "'prog.py'" in r.stdout
    assert set(Path(tempfile.gettempdir()).glob("mars-sbx-*")) - before == set()


def check_readonly_root_fs(b):
    repo = str(Path(__file__).parent / f"mars-ro-{uuid.uuid4().hex}")
    targets = [f"/var/tmp/mars-ro-{uuid.uuid4().hex}", f"/etc/mars-ro-{uuid.uuid4().hex}", repo]
    # a checkout under /tmp sits inside the sandbox's private /tmp: writable there, never on the host
    in_private_tmp = repo.startswith(("/tmp/", "/dev/shm/"))
    try:
        for t in targets:
            if t == repo and in_private_tmp:
                _run(b, f"open({t!r}, 'w').write('x')")
                continue
            r = _attack_fails(b, f"open({t!r}, 'w').write('x')")
            assert "Read-only file system" in r.stderr
        assert not any(os.path.exists(t) for t in targets)
    finally:
        for t in targets:
            if os.path.exists(t):
                os.remove(t)


def check_private_tmp(b):
    name = f"/tmp/mars-private-{uuid.uuid4().hex}"
    try:
        assert _run(b, f"open({name!r}, 'w').write('x')").passed     # lands in the sandbox's own /tmp ...
        assert not os.path.exists(name)                               # ... never in the host's
        _attack_fails(b, "open('/tmp/fill', 'wb').write(b'x' * (40 << 20))", tmpfs_mb=16, memory_mb=512)
    finally:
        if os.path.exists(name):
            os.remove(name)


def check_home_hidden(b):
    home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    d = Path(tempfile.mkdtemp(prefix=".mars-home-sentinel-", dir=home))
    try:
        _attack_fails(b, f"import os\nassert os.listdir({str(d)!r}) is not None")
        assert not any(d.iterdir())
    finally:
        d.rmdir()


def check_no_network(b):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.setblocking(False)
    try:
        port = srv.getsockname()[1]
        _attack_fails(b, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')")
        with pytest.raises(BlockingIOError):
            srv.accept()
    finally:
        srv.close()


def check_pid_namespace(b):
    _attack_fails(b, f"import os\nos.kill({os.getpid()}, 0)")      # the harness does not exist in there
    r = _run(b, "import os; print(len([p for p in os.listdir('/proc') if p.isdigit()]))")
    assert r.passed and int(r.stdout) <= 3


def check_no_process_outlives(b):
    marker = f"{random.randint(10**6, 10**7)}.{random.randint(10**5, 10**6)}"   # a unique 'sleep' argument
    r = _run(b, f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv('/bin/sleep', ['sleep', '{marker}'])
    os._exit(0)
time.sleep(0.3)
""")
    assert r.passed
    deadline = time.monotonic() + 3
    while True:
        alive = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, marker)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    for p in alive:
        os.kill(int(p), 9)
    assert alive == [], "a setsid daemon outlived the program"


def _cmdline_has(pid, marker):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False


def check_nproc_per_uid(b):
    r = _attack_fails(b, """
import os, time
n = 0
for _ in range(60):
    try:
        if os.fork() == 0:
            time.sleep(3); os._exit(0)
        n += 1
    except OSError:
        break
assert n >= 60, n
""", max_procs=16, timeout_s=10)
    assert "AssertionError" in r.stderr or "BlockingIOError" in r.stderr or r.status == "failed"


def check_unprivileged_uid(b):
    r = _attack_fails(b, "import os\nassert os.getuid() == 0 or os.geteuid() == 0")
    assert "AssertionError" in r.stderr
    _attack_fails(b, "import os\nos.setuid(0)")


CHECKS = {
    "wall_timeout": check_wall_timeout, "rlimit_cpu": check_rlimit_cpu, "rlimit_as_memory": check_rlimit_as_memory,
    "rlimit_fsize": check_rlimit_fsize, "rlimit_nofile": check_rlimit_nofile,
    "clean_env(PATH,LANG,HOME=tempdir)": check_clean_env, "fresh_temp_cwd_removed_after": check_fresh_temp_cwd,
    "readonly_root_fs": check_readonly_root_fs, "private_tmp_tmpfs_capped": check_private_tmp,
    "home_dirs_hidden": check_home_hidden, "no_network(net_namespace)": check_no_network,
    "pid_namespace(parent_invisible)": check_pid_namespace,
    "no_process_outlives_the_program": check_no_process_outlives,
    "rlimit_nproc(per-run unprivileged uid)": check_nproc_per_uid, "unprivileged_uid": check_unprivileged_uid,
    "rlimit_nproc(approximate: counts this user's processes)": check_nproc_per_uid,   # non-root harness
}
CLAIMS = [(b, c) for b in BACKENDS for c in S.sandbox_status(b)["enforced"]]


def test_the_fallback_is_usable_here():
    assert "unshare" in BACKENDS, "unshare namespaces should work on this machine (root, util-linux)"


def test_every_claim_has_a_check():
    assert {c for _, c in CLAIMS} <= set(CHECKS)


@pytest.mark.parametrize("backend,claim", CLAIMS, ids=[f"{b}-{c}" for b, c in CLAIMS])
def test_claim_is_enforced(backend, claim):
    CHECKS[claim](backend)


@pytest.mark.parametrize("backend", ["rlimit"])
def test_uncontained_backend_does_not_claim_containment(backend):
    """The attacks the rlimit backend cannot stop are listed as not enforced, and they do work there."""
    st = S.sandbox_status(backend)
    assert {"readonly_root_fs", "no_network(net_namespace)", "no_process_outlives_the_program"} <= \
        set(st["not_enforced"])
    name = f"/var/tmp/mars-rlimit-writes-{uuid.uuid4().hex}"
    try:
        assert _run(backend, f"open({name!r}, 'w').write('x')").passed and os.path.exists(name)
    finally:
        if os.path.exists(name):
            os.remove(name)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "rlimit"])
def test_killing_the_parent_or_the_harness_fails(backend):
    _attack_fails(backend, "import os, time\np = os.getppid()\nos.kill(p, 9)\ntime.sleep(0.5)\nassert os.getppid() != p")
    _attack_fails(backend, f"import os\nos.kill({os.getpid()}, 9)")
    assert _run(backend, "print('still here')").passed          # this process is alive and the run goes on
