"""SLURM sweeps (``mars-bench -m hydra/launcher=slurm ...``, docs/cluster.md): SLURM's refusals in one line.

The launcher is hydra-submitit-launcher's (``hydra_plugins/mars_bench_slurm``): each sweep job is one task of a
SLURM job array (at most ``array_parallelism`` running at once) that runs the job exactly as a local multirun
would. Jobs share nothing but the results root, where runs are directories named by their spec
(``tags.RunSpec``) and samples are claimed with ``flock`` (``locking``): jobs that need the same run (every theta
point's ``ar`` baseline) split its samples, a cancelled job's samples are taken by whoever reruns the sweep, and
two submissions of one sweep share the work.

When ``sbatch`` refuses the array (a partition, account, QOS, gres or limit this cluster does not have),
submitit prints sbatch's stderr and raises ``FailedJobError``; ``refusals_in_one_line`` turns that into one
line with SLURM's reason and the launcher settings given, exit 2, before any job ran. A job that fails while
running keeps submitit's error with its traceback.
"""
from __future__ import annotations

import io
import subprocess
import sys
from contextlib import contextmanager, redirect_stderr

# the launcher settings a refusal is most likely about, named in the one-line message when set
SETTINGS = ("partition", "account", "qos", "gres", "gpus_per_node", "gpus_per_task", "cpus_per_task", "mem_gb",
            "mem_per_gpu", "timeout_min", "constraint", "nodes")
PREFIX = "sbatch: error: "


def refusal(err: BaseException) -> str | None:
    """SLURM's reason when ``err`` is submitit's error for a refused ``sbatch`` (else None)."""
    from submitit.core.utils import FailedJobError

    cause = err.__cause__
    if not (isinstance(err, FailedJobError) and isinstance(cause, subprocess.CalledProcessError)
            and str(cause.cmd[0]).endswith("sbatch")):
        return None
    lines = [ln.strip() for ln in str(cause.stderr or "").splitlines() if ln.strip()]
    errors = [ln[len(PREFIX):] for ln in lines if ln.startswith(PREFIX)]
    return (errors or lines or [f"sbatch exited with {cause.returncode}"])[-1]


def message(reason: str, params: dict) -> str:
    """The one line for a refusal: SLURM's reason, the settings given, where to look up what is allowed."""
    given = " ".join(f"hydra.launcher.{k}={params[k]}" for k in SETTINGS if params.get(k) is not None)
    return (f"SLURM refused the sweep's jobs: {reason} (given: {given or 'the defaults'}); allowed: what this "
            "cluster offers (`sinfo -s` lists its partitions, `scontrol show partition` their limits)")


class _HideSbatchErrors(io.TextIOBase):
    """stderr without the ``sbatch: error:`` lines submitit prints before raising (said once instead, in
    ``refusals_in_one_line``'s line); everything else is passed on as written."""

    def __init__(self, real) -> None:
        self.real, self.hiding = real, False

    def write(self, text: str) -> int:
        if text.startswith(PREFIX):
            self.hiding = True
        elif self.hiding and text in ("\n", "\r\n"):
            self.hiding = False
        else:
            self.hiding = False
            self.real.write(text)
        return len(text)

    def flush(self) -> None:
        self.real.flush()


@contextmanager
def refusals_in_one_line(params: dict):
    """Around a launch: a refused ``sbatch`` ends the process with one line on stderr and exit 2."""
    try:
        with redirect_stderr(_HideSbatchErrors(sys.stderr)):
            yield
    except Exception as e:
        reason = refusal(e)
        if reason is None:
            raise
        print(f"mars-bench: error: {message(reason, params)}", file=sys.stderr)
        sys.exit(2)
