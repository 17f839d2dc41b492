"""A one-node SLURM cluster on localhost for the `slurm` test tier: munge, slurmctld and slurmd started from a
configuration written into a temporary directory, and stopped again (``local_cluster``, a context manager).

Nothing is installed here: the binaries come from Debian's ``slurm-wlm`` and ``munge`` (``.ci/slurm.sh``). No
cgroups (``proctrack/linuxproc``, ``task/none``), no accounting database; the node is this machine as
``slurmd -C`` describes it (its CPUs and memory). Every daemon runs in the foreground as a child of this
process, on its own munge socket and free TCP ports, so a system-wide munge or SLURM is never touched.
Client commands (sbatch, squeue, scancel) find the cluster through ``SLURM_CONF`` (``Cluster.env``).
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
PARTITION = "debug"


class MissingBinaries(RuntimeError):
    """The SLURM tier cannot start here (binaries missing, not root); the message is one line."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_line() -> str:
    """This machine as a SLURM node (``slurmd -C``'s first line: name, CPUs, sockets, cores, memory)."""
    out = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].strip()


def slurm_conf(root: Path, munge_socket: Path, node: str) -> str:
    ports = _free_port(), _free_port()
    name = node.split()[0].split("=", 1)[1]
    return "\n".join([
        "ClusterName=marsbench",
        f"SlurmctldHost={name}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU_Memory",
        "ReturnToService=2",
        "KillWait=1",                 # scancel: SIGTERM, then SIGKILL 1 s later (submitit jobs ignore SIGTERM)
        "MinJobAge=600",              # finished jobs stay visible to squeue / scontrol for the tier's length
        "SchedulerParameters=sched_interval=1",
        f"StateSaveLocation={root / 'state'}",
        f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd.log'}",
        f"{node} NodeAddr=127.0.0.1 State=UNKNOWN",
        f"PartitionName={PARTITION} Nodes={name} Default=YES MaxTime=60 State=UP",
        "",
    ])


@dataclass
class Cluster:
    root: Path
    conf: Path
    node: str
    procs: list = field(default_factory=list)

    @property
    def env(self) -> dict:
        """The environment a client (sbatch via the Hydra launcher, squeue, scancel) needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def cmd(self, *args: str, check: bool = True) -> str:
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60)
        if check and res.returncode:
            raise RuntimeError(f"{' '.join(args)}: exit {res.returncode}: {res.stderr.strip()}")
        return res.stdout

    def queue(self) -> list[tuple[str, str]]:
        """(job id, state) of every job still queued or running."""
        out = self.cmd("squeue", "--noheader", "--array", "--format=%i %T")
        return [tuple(line.split()) for line in out.splitlines() if line.strip()]

    def wait_empty(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while self.queue():
            if time.monotonic() > deadline:
                raise TimeoutError(f"jobs still queued after {timeout:.0f} s: {self.queue()}")
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n" + p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.root.glob("*.log")))


def _wait(what: str, ready, procs: list, timeout: float, logs) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{what}: {dead[0].args[0]} exited with {dead[0].returncode}\n{logs()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s\n{logs()}")
        time.sleep(0.2)


@contextmanager
def local_cluster(root: Path):
    """Start munge, slurmctld and slurmd under ``root`` (a fresh temporary directory), wait until the node is
    idle, yield the ``Cluster``; stop every daemon started here on the way out, failure or not."""
    missing = missing_binaries()
    if missing:
        raise MissingBinaries(f"SLURM tier: {', '.join(missing)} not found; run .ci/slurm.sh (as root) to install "
                              "slurm-wlm and munge")
    if os.geteuid() != 0:
        raise MissingBinaries("SLURM tier: needs root (slurmd runs jobs as their users; the daemons run as root here)")
    root = Path(root)
    for d in ("state", "spool", "munge"):
        (root / d).mkdir(parents=True, exist_ok=True, mode=0o700)
    key = root / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = root / "munge" / "munge.sock"
    node = node_line()
    conf = root / "slurm.conf"
    conf.write_text(slurm_conf(root, sock, node))
    cluster = Cluster(root, conf, node)
    try:
        cluster.procs.append(subprocess.Popen(
            [_binary("munged"), "-F", "--force", f"--socket={sock}", f"--key-file={key}",
             f"--pid-file={root / 'munge' / 'munged.pid'}", f"--seed-file={root / 'munge' / 'seed'}",
             f"--log-file={root / 'munged.log'}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait("munged", sock.exists, cluster.procs, 30, cluster.logs)
        for daemon in ("slurmctld", "slurmd"):
            cluster.procs.append(subprocess.Popen([_binary(daemon), "-D", "-f", str(conf)], env=cluster.env,
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        def idle() -> bool:
            res = subprocess.run(["sinfo", "--noheader", "--format=%T"], env=cluster.env, capture_output=True,
                                 text=True, timeout=30)
            return res.returncode == 0 and res.stdout.strip() == "idle"
        _wait("the node to become idle", idle, cluster.procs, 60, cluster.logs)
        yield cluster
    finally:
        if cluster.procs[1:]:   # no job outlives the tier: cancel whatever is left before stopping slurmd
            subprocess.run(["scancel", f"--partition={PARTITION}"], env=cluster.env, capture_output=True, timeout=30)
            try:
                cluster.wait_empty(30)
            except Exception:   # stopping the daemons below matters more than a clean queue
                pass
        for p in reversed(cluster.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in reversed(cluster.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
