"""Hostile model-written programs: each scores 0, the run goes on, nothing outside the sandbox changes.

Every attack below is written so that the program passes only if the attack worked; the tests also check the
effects from outside (files, listener, processes)."""
import json
import os
import pwd
import shutil
import socket
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from mars_bench.tasks import Sample, get_task, sandbox_status
from mars_bench.tasks.sandbox import _UID_BASE, _uids_in_use, run_python

ROOT = Path(__file__).resolve().parent.parent
STATUS = sandbox_status()
BWRAP = STATUS["backend"] == "bwrap"
needs_bwrap = pytest.mark.skipif(not BWRAP, reason=f"bubblewrap not usable here: {STATUS}")


def _problem() -> Sample:
    return Sample(id="attack/0", turns=["x"], reference={
        "prompt": "def f():\n", "test": "def check(candidate):\n    assert candidate() == 1\n",
        "entry_point": "f", "canonical_solution": "    return 1\n"})


def _score(code: str, backend: str = "auto", **opts) -> dict:
    task = get_task("humaneval", timeout_s=opts.get("timeout_s", 3), memory_mb=opts.get("memory_mb", 512),
                    sandbox_backend=backend)
    return task.score(_problem(), [f"```python\n{textwrap.dedent(code)}\n```"])


def _sandbox_procs() -> list[int]:
    return [u for u in _uids_in_use() if u >= _UID_BASE]


def _benign_passes(backend: str = "auto") -> bool:
    return _score("def f():\n    return 1\n", backend)["passed"] == 1


@pytest.fixture
def sentinels(monkeypatch):
    """A fake HOME and a sentinel dir in /var/tmp (visible read-only inside the sandbox), one in the real home
    (hidden inside), each holding a file; all must be unchanged afterwards."""
    made = []
    visible = Path(tempfile.mkdtemp(prefix="mars-sentinel-", dir="/var/tmp"))
    fake_home = Path(tempfile.mkdtemp(prefix="mars-fakehome-", dir="/var/tmp"))
    made += [visible, fake_home]
    real_home = Path(pwd.getpwuid(os.getuid()).pw_dir)
    try:
        hidden = Path(tempfile.mkdtemp(prefix=".mars-sentinel-", dir=real_home))
        made.append(hidden)
    except OSError:
        hidden = None
    for d in made:
        (d / "keep.txt").write_text("keep me")
    monkeypatch.setenv("HOME", str(fake_home))
    yield {"visible": visible, "fake_home": fake_home, "hidden": hidden}
    for d in made:
        assert (d / "keep.txt").read_text() == "keep me", d
        assert sorted(p.name for p in d.iterdir()) == ["keep.txt"], d
        shutil.rmtree(d, ignore_errors=True)


def test_status_is_recorded():
    assert STATUS["backend"] in ("bwrap", "rlimit")
    assert STATUS["enforced"] and isinstance(STATUS["not_enforced"], list)


def test_benign_program_and_output():
    r = run_python("import sys; print('out'); print('err', file=sys.stderr)", timeout_s=10)
    assert r.passed and r.stdout == "out\n" and r.stderr == "err\n"
    assert run_python("raise SystemExit(3)", timeout_s=10).returncode == 3


def test_hang_times_out():
    r = _score("def f():\n    while True:\n        pass\n")
    assert r["passed"] == 0 and r["status"] == "timeout" and r["wall_s"] < 10
    assert _benign_passes()


def test_memory_bomb():
    r = _score("def f():\n    a = []\n    while True:\n        a.append(bytearray(10**7))\n", timeout_s=20)
    assert r["passed"] == 0 and r["status"] == "failed" and "MemoryError" in (r["error"] or "")
    assert _benign_passes()


def test_secret_env_not_inherited(monkeypatch):
    monkeypatch.setenv("MARS_SECRET_TEST", "s3cr3t-" + uuid.uuid4().hex)
    r = _score("""
        import os
        def f():
            if os.environ.get("MARS_SECRET_TEST"):
                return 1
            for pid in os.listdir("/proc"):
                try:
                    with open(f"/proc/{pid}/environ", "rb") as fh:
                        if b"MARS_SECRET_TEST=" in fh.read():
                            return 1
                except OSError:
                    pass
            raise RuntimeError("no secret")
        """ if BWRAP else """
        import os
        def f():
            return 1 if os.environ.get("MARS_SECRET_TEST") else 0
        """)
    assert r["passed"] == 0
    out = run_python("import os, json; print(json.dumps(dict(os.environ)))", timeout_s=10)
    assert "MARS_SECRET_TEST" not in out.stdout and set(eval(out.stdout)) <= {"PATH", "LANG", "HOME", "TMPDIR", "PWD"}


def test_kill_parent():
    r = _score("""
        import os, time
        def f():
            ppid = os.getppid()
            os.kill(ppid, 9)
            time.sleep(0.5)
            if os.getppid() == ppid:
                raise RuntimeError("parent survived")
            return 1
        """)
    assert r["passed"] == 0
    assert _benign_passes()            # this process is alive and the run goes on


@needs_bwrap
def test_kill_harness_by_pid():
    r = _score(f"import os\ndef f():\n    os.kill({os.getpid()}, 9)\n    return 1\n")
    assert r["passed"] == 0 and _benign_passes()


@pytest.mark.skipif(not any(e.startswith("rlimit_nproc(per-run") for e in STATUS["enforced"]),
                    reason="RLIMIT_NPROC cannot be enforced here (root without a uid to drop to)")
def test_fork_bomb():
    r = _score("""
        import os
        def f():
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
        """)
    assert r["passed"] == 0 and r["status"] in ("timeout", "failed")
    assert _sandbox_procs() == []      # the whole namespace / uid was killed
    assert _benign_passes()


@needs_bwrap
def test_rm_rf_home(sentinels):
    targets = [str(p) for p in sentinels.values() if p is not None]
    r = _score(f"""
        import os, subprocess
        def f():
            subprocess.run(["rm", "-rf", os.path.expanduser("~"), *{targets!r}], check=True)
            subprocess.run("rm -rf ~/* ~/.[!.]*", shell=True, check=True)
            for t in {targets!r}:
                if os.path.exists(t):
                    raise RuntimeError("still there: " + t)
            return 1
        """)
    assert r["passed"] == 0
    assert _benign_passes()


@needs_bwrap
def test_write_outside_temp_dir(sentinels):
    host_tmp = f"/tmp/mars-sbx-escape-{uuid.uuid4().hex}"
    var_tmp = f"/var/tmp/mars-sbx-escape-{uuid.uuid4().hex}"     # world-writable on the host
    repo_file = ROOT / f"mars-sbx-escape-{uuid.uuid4().hex}.txt"
    try:
        r = _score(f"""
            def f():
                open({host_tmp!r}, "w").write("x")          # lands in the sandbox's private /tmp
                open({var_tmp!r}, "w").write("x")           # read-only root
                return 1
            """)
        assert r["passed"] == 0 and "Read-only file system" in (r["error"] or ""), r
        for target in (sentinels["visible"] / "new.txt", sentinels["fake_home"] / "new.txt", repo_file):
            r = _score(f"def f():\n    open({str(target)!r}, 'w').write('x')\n    return 1\n")
            assert r["passed"] == 0, (target, r)
        assert not any(os.path.exists(p) for p in (host_tmp, var_tmp, repo_file))
    finally:
        for p in (host_tmp, var_tmp, repo_file):
            if os.path.exists(p):
                os.remove(p)


@needs_bwrap
def test_loopback_connection_blocked():
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    srv.setblocking(False)
    port = srv.getsockname()[1]
    try:
        r = _score(f"""
            import socket
            def f():
                socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"hello")
                return 1
            """)
        assert r["passed"] == 0
        with pytest.raises(BlockingIOError):
            srv.accept()               # nobody reached the listener
    finally:
        srv.close()


def test_no_temp_dirs_left_behind():
    before = set(Path(tempfile.gettempdir()).glob("mars-sbx-*"))
    for code in ("print(1)", "while True: pass", "raise SystemExit(2)"):
        run_python(code, timeout_s=2)
    assert set(Path(tempfile.gettempdir()).glob("mars-sbx-*")) - before == set()


# ---- without bubblewrap: auto takes unshare, else refuses; rlimit only when asked for ----------------------
def test_auto_falls_back_to_unshare_then_refuses(monkeypatch):
    from mars_bench.tasks import sandbox

    monkeypatch.delenv(sandbox.ENV_BACKEND, raising=False)
    assert sandbox.choose_backend(None, usable={"bwrap": False, "unshare": True}) == "unshare"
    with pytest.raises(sandbox.SandboxUnavailable) as e:
        sandbox.choose_backend(None, usable={"bwrap": False, "unshare": False})
    msg = str(e.value)
    assert "\n" not in msg and "apt-get install bubblewrap" in msg and "MARS_BENCH_SANDBOX=rlimit" in msg
    with pytest.raises(sandbox.SandboxUnavailable, match="'bwrap'"):
        sandbox.choose_backend("bwrap", usable={"bwrap": False, "unshare": True})
    with pytest.raises(sandbox.SandboxUnavailable, match="allowed: auto, bwrap, unshare, rlimit"):
        sandbox.choose_backend("nsjail")


def test_rlimit_only_when_chosen_explicitly_and_loud(monkeypatch):
    from mars_bench.tasks import sandbox

    monkeypatch.setenv(sandbox.ENV_BACKEND, "rlimit")          # the explicit setting wins over the task option
    monkeypatch.setitem(sandbox._probe_cache, "warned", False)
    with pytest.warns(RuntimeWarning, match="NOT CONTAINED"):
        assert sandbox.choose_backend("bwrap", usable={"bwrap": True}) == "rlimit"
    assert "no_process_outlives_the_program" in sandbox.sandbox_status()["not_enforced"]


def test_humaneval_refuses_at_load_without_a_containing_sandbox(tmp_path):
    """A new user without bubblewrap and without unshare: one line before any model loads, nothing written."""
    import subprocess
    import sys

    from .conftest import data_dir

    env = {**os.environ, "PATH": str(tmp_path / "empty-bin"), "MARS_BENCH_DATA_DIR": str(data_dir()),
           "OMP_NUM_THREADS": "1"}
    env.pop("MARS_BENCH_SANDBOX", None)
    res = subprocess.run([sys.executable, "-m", "mars_bench.cli", "model=tiny", "task=humaneval", "limit=1",
                          f"results_dir={tmp_path / 'r'}", "progress=false"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "refuses" in lines[0] and "MARS_BENCH_SANDBOX=rlimit" in lines[0], res.stderr
    assert not (tmp_path / "r").exists()


def test_rlimit_backend_basics(monkeypatch):
    assert sandbox_status("rlimit")["backend"] == "rlimit"
    assert "readonly_root_fs" in sandbox_status("rlimit")["not_enforced"]
    assert _benign_passes("rlimit")
    assert _score("def f():\n    while True:\n        pass\n", "rlimit")["status"] == "timeout"
    r = _score("def f():\n    a = []\n    while True:\n        a.append(bytearray(10**7))\n", "rlimit",
               timeout_s=20)
    assert r["passed"] == 0 and "MemoryError" in (r["error"] or "")
    monkeypatch.setenv("MARS_SECRET_TEST", "s3cr3t")
    assert _score("import os\ndef f():\n    return 1 if os.environ.get('MARS_SECRET_TEST') else 0\n",
                  "rlimit")["passed"] == 0
    r = _score("import os, time\ndef f():\n    p = os.getppid()\n    os.kill(p, 9)\n    time.sleep(0.5)\n"
               "    return 1 if os.getppid() != p else 0\n", "rlimit")
    assert r["passed"] == 0 and _benign_passes("rlimit")


def test_program_output_stays_out_of_the_record():
    secret = uuid.uuid4().hex
    r = _score(f"""
        import sys
        def f():
            print("{secret}-out")
            sys.stderr.write("{secret}-err\\n" * 50)
            raise ValueError("x" * 500)
        """)
    assert r["passed"] == 0 and secret not in json.dumps(r)
    assert r["error"].startswith("exception ValueError: xxx") and len(r["error"]) < 130
    r = _score(f"import sys\ndef f():\n    sys.stderr.write('{secret}\\n')\n    sys.exit(3)\n")
    assert r["error"] == "exit code 3" and secret not in json.dumps(r)
