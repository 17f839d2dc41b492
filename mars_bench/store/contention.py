"""What the machine did while a sample was timed, and the rule that flags a sample decoded under contention
(docs/timing.md). Linux only (/proc); elsewhere nothing is measured and nothing flagged.

Per timed sample (``Probe.begin`` before its first turn, ``Probe.end`` after its last, before scoring) a
``Contention`` record holds, over the sample's wall time ``wall_s``:
  cpu_s         this process's CPU time, user + sys, all its threads (getrusage); cpu_s / wall_s is the cores it
                kept busy, at most ``threads`` (torch's compute threads) plus a little
  other_cpu_s   CPU time the whole machine spent outside idle, iowait and steal (/proc/stat's first line: user,
                nice, system, irq, softirq; guest time is inside user) minus cpu_s: what other processes and the
                kernel's work for them took
  steal_s       time the hypervisor ran other guests on our virtual CPUs (/proc/stat's steal); None where the
                kernel does not report it
  runnable      mean and max of the runnable tasks (/proc/stat's procs_running, this process's running threads
                included), sampled every RUNNABLE_PERIOD_S by a daemon thread; None when no reading fell in the
                sample
  load1         the 1-minute load average at the end (/proc/loadavg)
  cpus          online CPUs

The rule (``disturbed``): a sample is flagged when other processes kept more than OTHER_CORES_LIMIT cores busy on
average over it (other_cpu_s / wall_s), or steal took more than STEAL_CORES_LIMIT cores (steal_s / wall_s).
/proc/stat counts in clock ticks (10 ms), so a sample shorter than a few ticks reads coarsely; the run queue and
the load average are recorded to explain a flag, not used by the rule (they count this process's own threads).
"""
from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import asdict, dataclass, fields

OTHER_CORES_LIMIT = 0.25   # cores other processes kept busy on average over the sample (docs/timing.md)
STEAL_CORES_LIMIT = 0.10   # cores stolen by the hypervisor on average over the sample
RUNNABLE_PERIOD_S = 0.25   # how often the run queue is sampled
STAT = "/proc/stat"
LOADAVG = "/proc/loadavg"


@dataclass(frozen=True)
class Contention:
    """The machine over one timed sample (module doc); written in a sample record as ``contention``."""
    wall_s: float
    cpu_s: float
    other_cpu_s: float | None
    steal_s: float | None = None
    threads: int | None = None
    runnable_mean: float | None = None
    runnable_max: int | None = None
    load1: float | None = None
    cpus: int | None = None

    @property
    def other_cores(self) -> float | None:
        """Cores other processes kept busy on average over the sample."""
        return None if self.other_cpu_s is None or self.wall_s <= 0 else max(0.0, self.other_cpu_s) / self.wall_s

    @property
    def steal_cores(self) -> float | None:
        return None if self.steal_s is None or self.wall_s <= 0 else self.steal_s / self.wall_s

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data) -> "Contention":
        """From a record's ``contention`` (unknown keys dropped); a Contention as is."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict) or "wall_s" not in data or "cpu_s" not in data:
            raise ValueError(f"contention {data!r:.60}; allowed: a JSON object with wall_s and cpu_s")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


def why_disturbed(c: "Contention | dict | None") -> str | None:
    """Why the rule flags a sample ('other processes 1.02 cores'), or None: undisturbed, or not recorded."""
    if c is None:
        return None
    c = Contention.from_dict(c)
    other, steal = c.other_cores, c.steal_cores
    reasons = ([f"other processes {other:.2f} cores"] if other is not None and other > OTHER_CORES_LIMIT else []) + (
        [f"steal {steal:.2f} cores"] if steal is not None and steal > STEAL_CORES_LIMIT else [])
    return "; ".join(reasons) or None


def disturbed(c: "Contention | dict | None") -> bool:
    """Whether a sample was decoded under contention by the rule (module doc); False when not recorded."""
    return why_disturbed(c) is not None


MEASURE_ENV = "MARS_BENCH_CONTENTION"   # "off": nothing measured (records say "not recorded"; the test suite's tiny runs)


def measuring() -> bool:
    """Whether timed samples are measured (on unless MARS_BENCH_CONTENTION=off, and /proc/stat is readable)."""
    return os.environ.get(MEASURE_ENV, "on") != "off" and os.path.exists(STAT)


def retimes(record: dict, writer: str) -> bool:
    """Whether a rerun decodes ``record`` again: it was timed under contention by another process than ``writer``
    (this one: a study's later rounds do not re-time its own samples; rerunning the command does)."""
    return disturbed(record.get("contention")) and record.get("writer") != writer


# ---- readings -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StatReading:
    """The first line of /proc/stat in seconds: busy (user+nice+system+irq+softirq), steal (None: not reported)."""
    busy_s: float
    steal_s: float | None
    procs_running: int | None


def parse_stat(text: str, tick_hz: float | None = None) -> StatReading:
    """A /proc/stat text as a ``StatReading`` (fields in clock ticks, ``tick_hz`` per second)."""
    tick_hz = tick_hz or os.sysconf("SC_CLK_TCK")
    cpu = next((ln.split()[1:] for ln in text.splitlines() if ln.startswith("cpu ")), None)
    if cpu is None:
        raise ValueError(f"{STAT} text without a 'cpu ' line; allowed: the kernel's /proc/stat")
    ticks = [int(x) for x in cpu]
    busy = sum(ticks[i] for i in (0, 1, 2, 5, 6) if i < len(ticks))
    running = next((int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("procs_running ")), None)
    return StatReading(busy / tick_hz, ticks[7] / tick_hz if len(ticks) > 7 else None, running)


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def read_stat() -> StatReading | None:
    text = _read(STAT)
    return parse_stat(text) if text else None


def _own_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _load1() -> float | None:
    text = _read(LOADAVG)
    return float(text.split()[0]) if text else None


class _RunQueue:
    """A daemon thread summing /proc/stat's procs_running every RUNNABLE_PERIOD_S: (sum, count, max so far)."""

    def __init__(self):
        self.total, self.count, self.peaks = 0, 0, []
        threading.Thread(target=self._loop, name="mars-bench-runqueue", daemon=True).start()

    def _loop(self):
        while True:
            r = read_stat()
            if r is None or r.procs_running is None:
                return
            self.total, self.count = self.total + r.procs_running, self.count + 1
            self.peaks.append(r.procs_running)
            del self.peaks[:-4096]
            time.sleep(RUNNABLE_PERIOD_S)

    def mark(self) -> tuple[int, int]:
        return self.total, self.count


_QUEUE: _RunQueue | None = None
_QUEUE_LOCK = threading.Lock()


def _queue() -> _RunQueue:
    global _QUEUE
    with _QUEUE_LOCK:
        if _QUEUE is None:
            _QUEUE = _RunQueue()
        return _QUEUE


@dataclass(frozen=True)
class _Mark:
    wall: float
    cpu_s: float
    stat: StatReading | None
    queue: tuple[int, int]


class Probe:
    """Measures ``Contention`` over spans: ``mark = probe.begin()`` ... ``probe.end(mark)``. ``threads``: the
    process's compute threads (recorded)."""

    def __init__(self, threads: int | None = None):
        self.threads = threads
        self.queue = _queue() if os.path.exists(STAT) else None

    def begin(self) -> _Mark:
        return _Mark(time.perf_counter(), _own_cpu_s(), read_stat(), self.queue.mark() if self.queue else (0, 0))

    def end(self, mark: _Mark) -> Contention | None:
        """The span since ``mark``; None where /proc/stat cannot be read (no measurement, not 'undisturbed')."""
        wall, cpu, stat = time.perf_counter() - mark.wall, _own_cpu_s() - mark.cpu_s, read_stat()
        if stat is None or mark.stat is None:
            return None
        total, count = self.queue.mark() if self.queue else (0, 0)
        n = count - mark.queue[1]
        peaks = self.queue.peaks[-n:] if self.queue and n > 0 else []
        steal = None if stat.steal_s is None or mark.stat.steal_s is None else stat.steal_s - mark.stat.steal_s
        return Contention(wall_s=wall, cpu_s=cpu, other_cpu_s=stat.busy_s - mark.stat.busy_s - cpu, steal_s=steal,
                          threads=self.threads, runnable_mean=(total - mark.queue[0]) / n if n > 0 else None,
                          runnable_max=max(peaks) if peaks else None, load1=_load1(), cpus=os.cpu_count())


BUSY_CHECK_S = 0.5   # the least time the machine is watched before a timed phase


def busy_since(mark: _Mark, least_s: float = BUSY_CHECK_S) -> str | None:
    """The machine since ``mark`` (``Probe().begin()`` taken as a timed phase is prepared: loading models counts as
    this process's own CPU), waiting until ``least_s`` have passed: why the rule would flag a sample decoded now
    ('other processes 1.96 cores'), or None (quiet, or /proc unreadable)."""
    left = least_s - (time.perf_counter() - mark.wall)
    if left > 0:
        time.sleep(left)
    return why_disturbed(Probe().end(mark))
