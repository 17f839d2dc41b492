"""`make reproduce-full` as named shards: each a list of mars-bench commands with its own results tree
(``results/shards/<name>/``) and its own pack (``results/study/<name>.tar.xz``, written once every command of the
shard has finished), so that the study can be spread over sittings.

    python -m mars_bench.run.shards list                       # names, what each runs, its estimated time
    python -m mars_bench.run.shards run NAME [NAME ...] [--allow-dirty] [-- override ...]   # overrides: every command
    python -m mars_bench.run.shards run --all                  # every shard whose pack is not there yet
    python -m mars_bench.run.shards park NAME                  # a stopped shard's records, to resume at another sitting
    python -m mars_bench.run.shards retime NAME [NAME ...]     # a packed shard's timed phase decoded again here
    python -m mars_bench.run.shards check-clean [--allow-dirty]  # refuse a run from a tree with uncommitted changes

Resuming: rerunning a shard reruns its commands in the same results tree, and every run resumes (finished
samples are skipped, a line torn by a kill is cut off: docs/reproduce.md); a shard's timed phase has a fixed
size (``study.timed_min`` = ``study.timed_max``), so which samples are timed never depends on when the run was
interrupted: an interrupted shard ends with exactly the samples of an uninterrupted one. A shard whose pack
exists is done and is skipped. The report reads any set of packs and names the shards missing from it
(``missing``).

Sittings on different machines: ``park`` packs a stopped shard's unfinished tree to ``results/parts/<name>.tar.xz``
(commit it); ``run`` on a machine without that tree unpacks the part first and resumes from it, then removes it
once the shard's pack is written. A part is resumed only by the same decoding code (``same_code``: no change to
the package, tasks or configs since the commit its records name; the report and docs may differ) on a machine of
the same kind (CPU model, family and model numbers, instruction sets, GPU: ``provenance.machine``), so that its
records and the resumed ones are those of one run; ``--allow-mixed`` resumes anyway (the records then name both
commits or machines, and the report shows which).

A tree with uncommitted changes records its commit as ``<sha>+dirty`` (``provenance.git_commit``); ``run`` and
``check-clean`` refuse such a tree unless ``--allow-dirty`` (``ALLOW_DIRTY=1`` in the Makefile).

Sizes: ``Shard.est_min`` is the minutes each shard is expected to take on the 2-core Intel Xeon with AMX that
ran the committed study (results/study.tar.xz, commit 184c14b+dirty, 30 min 43 s for WMT19 100 + GSM8K 40), scaled
from its timed phase (sum of the timed records' wall time) and its quality phase (the rest of the run), and, for
the tasks it did not run, from the 16-sample prefixes of docs/reproduce.md (same machine kind, int8 draft: upper
bounds). On an AVX2-only EPYC the shards took 1.3-2.8x these minutes (wmt19 59 min quiet on a Zen 3, family 25,
its batched quality phase 3.0x the estimate; mt_bench 101 min there, its quality phase 1.9x; humaneval ~93 min
and cnn_dm ~149 min there, each in two sittings, 1.3x; gsm8k ~73 min, alpaca ~81 min and trees 56 min, partly
beside other work: docs/reproduce.md, "Shards run")."""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from mars_bench.base.errors import InputError
from mars_bench.store.provenance import DECODING, same_code

RUNS = Path("results/shards")    # each shard's results tree: RUNS/<name>/ (not committed)
PACKS = Path("results/study")    # each shard's pack: PACKS/<name>.tar.xz (committed)
PARTS = Path("results/parts")    # a parked shard's records: PARTS/<name>.tar.xz (committed until its pack is)
ROOT = Path(__file__).resolve().parents[2]
DRAFT = ("model.draft_quant=q4",)   # the committed study's draft (Makefile STUDY_DRAFT)


@dataclass(frozen=True)
class Shard:
    commands: tuple[tuple[str, ...], ...]   # mars-bench argument lists, run in order in the shard's tree
    est_min: float                          # expected minutes on the AMX machine (module doc)
    what: str
    prepare: tuple[str, ...] = ()           # python -m argument list run first (resumable; what the commands read)


def _methods(task: str, timed: int, experiment: str = "study_methods") -> tuple[str, ...]:
    return (f"+experiment={experiment}", f"task={task}", f"study.timed_min={timed}", f"study.timed_max={timed}",
            *DRAFT)


T1 = ("temperature=1.0", "top_p=1.0", "rule.sampled_top1=margin", "rule.nonpositive_top1=ratio")   # study_t1's
EAGLE3_TASKS = (("wmt19_zh_en", 12), ("humaneval", 8), ("gsm8k", 8))
EAGLE3_HEAD = ("mars_bench.run.eagle3_recipe", "embedded-sitting", "--work", "results/eagle3-head/embedded-sitting")
EAGLE3_EST = 56.0   # the six commands of both shards: ~34 min timed (study_eagle3.yaml: 4 x 3 tasks x 2 temperatures x 5 entries at
#                    ~0.8 s per output token of all entries), ~16 min of batched quality phases, ~6 min of loading


# est_min: quality + timed minutes (module doc). WMT19: quality 10.8 (the committed run's 30.7 min less its 11.1
# min of timed records, split 15.2 : 12.5 between WMT19 and GSM8K as at 1cfbcf9) + timed 5.9 x 48 / 12. GSM8K:
# 8.8 x 121 / 40 + 5.2 x 8 / 4. Others: docs/reproduce.md's quality projection + timed n x mean tokens x 0.41 s.
SHARDS: dict[str, Shard] = {
    "wmt19": Shard((("+experiment=study_theta", "task=wmt19_zh_en", "study.timed_min=48", "study.timed_max=48",
                     *DRAFT),), 10.8 + 5.9 * 4, "WMT19 zh-en, the authors' 100 segments, θ sweep; 48 timed"),
    "gsm8k": Shard((_methods("gsm8k", 8),), 8.8 * 121 / 40 + 5.2 * 2, "GSM8K, the first 121; 8 timed"),
    "humaneval": Shard((_methods("humaneval", 8),), 64 + 8 * 159 * 0.41 / 60, "HumanEval, all 164; 8 timed"),
    "mt_bench": Shard((_methods("mt_bench", 4),), 45 + 4 * 630 * 0.41 / 60,
                      "MT-Bench, 80 x 2 turns (no judge: speed, tau, fidelity); 4 timed"),
    "alpaca": Shard((_methods("alpaca", 8),), 23 + 8 * 123 * 0.41 / 60, "Alpaca, Spec-Bench's 80; 8 timed"),
    "cnn_dm": Shard((_methods("cnn_dm", 4),), 110 + 4 * 120 * 0.41 / 60,
                    "CNN/DM, Spec-Bench's 80 (prompts to 1,372 tokens: the least certain); 4 timed"),
    "trees": Shard((("+experiment=paper_trees", "task=wmt19_zh_en", "limit=16"),), 20,
                   "the T = 1 tree arm, WMT19 segments 1-16, one seed"),
    # The paper's regime (issue 48): chains at T = 1 with the authors' rule settings (conf/experiment/study_t1.yaml),
    # seed 0; longer than a sitting, so parked and resumed (`park`). est_min: gsm8k_t1's quality phase decoded ar's
    # first 77 samples at 26 s each at 16 rows on the AMX machine (longer outputs and a lower tau than greedy), so
    # 363 samples (sd is decoded too at T = 1) ~157 min, plus 8 timed x 3 methods at ~2.5x the greedy timed phase;
    # humaneval_t1 scaled from it by its sample count (not measured).
    "gsm8k_t1": Shard((_methods("gsm8k", 8, "study_t1"),), 363 * 26 / 60 + 2.5 * 5.2 * 2,
                      "GSM8K, the first 121, T = 1 chains (their SPD table), seed 0; 8 timed"),
    "humaneval_t1": Shard((_methods("humaneval", 8, "study_t1"),), (363 * 26 / 60 + 2.5 * 5.2 * 2) * 164 / 121,
                          "HumanEval, all 164, T = 1 chains (their SPD table), seed 0; 8 timed"),
    # The paper's main setting at its n (issue 48): T = 1 trees with the theta sweep (conf/experiment/
    # study_trees_t1.yaml: 15 entries; trees_t1_wmt19 ran the 14 before mars_tree's exact-verified twin was added),
    # 12 timed; parked and resumed over sittings. est_min: the trees pack's 16 segments x 13 entries at batch size 1
    # took 20 min on the AMX machine (~5.8 s a segment and entry), so 100 segments x 13 decoded entries ~125 min (the
    # quality phase's batching not counted: an upper bound) + 12 timed x 14 ~16 min; HumanEval's T = 1 outputs are
    # ~4x WMT19's in tokens (humaneval_t1), so 164 problems x 14 decoded entries ~6.6 x 14 / 13 times WMT19's.
    "trees_t1_wmt19": Shard((("+experiment=study_trees_t1", "task=wmt19_zh_en"),), 5.8 * 13 * 100 / 60 + 16,
                            "WMT19 zh-en, the authors' 100 segments, T = 1 trees, theta sweep; 12 timed"),
    "trees_t1_humaneval": Shard((("+experiment=study_trees_t1", "task=humaneval"),),
                                (5.8 * 14 * 100 / 60 + 17) * 6.6,
                                "HumanEval, all 164, T = 1 trees, theta sweep; 12 timed (several sittings)"),
    # The paper's other temperature (issue 48): the θ sweep of wmt19 (study_theta.yaml: ar, sd, mars at the authors'
    # θ grid, chains k 4) at T = 0.2, top-p 1, with the authors' rule settings; sd is lossless sampling, so its
    # quality is decoded too (7 entries, not wmt19's 6). est_min: wmt19's quality phase x 7 / 6 + 12 timed x 7
    # entries at wmt19's 5.9 min per 12 x 6.
    "wmt19_t02": Shard((("+experiment=study_theta", "task=wmt19_zh_en", "study.timed_min=12", "study.timed_max=12",
                         "temperature=0.2", *T1[1:], *DRAFT),), 10.8 * 7 / 6 + 5.9 * 7 / 6,
                       "WMT19 zh-en, the authors' 100 segments, θ sweep at T = 0.2 (their other temperature); "
                       "12 timed"),
    # EAGLE-3 with a head trained here (issue 50): the paper's Table 1 analogue (conf/experiment/study_eagle3.yaml) on
    # subsets of WMT19, HumanEval and GSM8K, 4 timed each: eagle3 greedy, eagle3_t1 at T = 1 (the authors' rule
    # settings), two packs so that each fits a sitting beside the head's training. The head comes from its recipe
    # (`prepare`: features and training resume; a head already there is kept), so a shard run on another machine
    # trains its own; the records name the head's weights (run.json's draft_model). est_min: the recipe's ~36 min on
    # the AMX machine (docs/eagle3.md; 73 min on the AVX512_BF16 EPYC, 7.5 s a step) + the three commands.
    "eagle3": Shard(tuple(("+experiment=study_eagle3", f"task={task}", f"limit={n}") for task, n in EAGLE3_TASKS),
                    36 + EAGLE3_EST / 2, "EAGLE-3 head (0.2M training tokens) vs ar and the 0.5B chain, greedy, "
                    "WMT19 12 / HumanEval 8 / GSM8K 8; 4 timed", EAGLE3_HEAD),
    "eagle3_t1": Shard(tuple(("+experiment=study_eagle3", f"task={task}", f"limit={n}", *T1)
                             for task, n in EAGLE3_TASKS), 36 + EAGLE3_EST / 2,
                       "the same at T = 1 (the authors' rule settings); 4 timed", EAGLE3_HEAD),
}


class DirtyTree(RuntimeError):
    pass


class PartMismatch(RuntimeError):
    """A parked shard whose records another code or another kind of machine decoded."""


def check_clean(allow_dirty: bool) -> str:
    """The commit the records will carry; DirtyTree when it is '+dirty' and ``allow_dirty`` is false."""
    from mars_bench.store.provenance import git_commit

    commit = git_commit()
    if commit.endswith("+dirty") and not allow_dirty:
        raise DirtyTree(f"the working tree has uncommitted changes (commit {commit}); allowed: a clean tree, or "
                        "--allow-dirty (ALLOW_DIRTY=1) to run anyway, the records then say +dirty")
    return commit


def pack_path(name: str, packs: Path = PACKS) -> Path:
    return Path(packs) / f"{name}.tar.xz"


def run_shard(name: str, shards: dict[str, Shard] | None = None, runs: Path = RUNS, packs: Path = PACKS,
              extra: tuple[str, ...] = (), cwd: Path | None = None, parts: Path = PARTS,
              allow_mixed: bool = False) -> Path:
    """Run (or resume) one shard's commands in ``runs/<name>`` (from its part when it was parked and the tree is
    not here: ``restore``), then write its pack and remove the part; returns the pack's path. A shard whose pack
    exists is skipped. A failing command raises CalledProcessError (the runs stay)."""
    from mars_bench.store.pack import pack

    shards = SHARDS if shards is None else shards
    if name not in shards:
        raise InputError(f"shard {name!r}; allowed: {', '.join(shards)}")
    out = pack_path(name, packs)
    if out.is_file():
        print(f"shards: {name}: done ({out} exists)", file=sys.stderr)
        return out
    tree = Path(runs) / name
    restore(name, runs, parts, allow_mixed)
    prepare(name, shards[name], cwd)
    for args in shards[name].commands:
        cmd = [sys.executable, "-m", "mars_bench.cli", *args, *extra, f"results_dir={tree}"]
        print(f"shards: {name}: {' '.join(cmd[2:])}", file=sys.stderr)
        subprocess.run(cmd, check=True, cwd=cwd)
    members = pack(tree, out)
    print(f"shards: {name}: packed {len(members)} files to {out}", file=sys.stderr)
    part = pack_path(name, parts)
    if part.is_file():
        part.unlink()
        print(f"shards: {name}: its part {part} is in the pack now; removed (commit the removal)", file=sys.stderr)
    return out


def prepare(name: str, shard: Shard, cwd: Path | None = None) -> None:
    """Run the shard's ``prepare`` command (e.g. the EAGLE-3 recipe that trains the head its commands read):
    resumable, and quick when its output is there already."""
    if shard.prepare:
        cmd = [sys.executable, "-m", *shard.prepare]
        print(f"shards: {name}: {' '.join(cmd[1:])}", file=sys.stderr)
        subprocess.run(cmd, check=True, cwd=cwd)


def park(name: str, runs: Path = RUNS, parts: Path = PARTS, packs: Path = PACKS) -> Path:
    """Pack the stopped shard ``name``'s unfinished tree to ``parts/<name>.tar.xz``, to commit and resume at
    another sitting (``restore``). Stop the shard first: a sample being written when it is parked is decoded
    again on resuming."""
    from mars_bench.store.pack import pack

    if name not in SHARDS:
        raise InputError(f"shard {name!r}; allowed: {', '.join(SHARDS)}")
    if pack_path(name, packs).is_file():
        raise InputError(f"shard {name!r} is done ({pack_path(name, packs)} exists); allowed: a shard not packed yet")
    tree = Path(runs) / name
    if not _has_samples(tree):
        raise InputError(f"shard {name!r} has no records in {tree}; allowed: a shard that has run here")
    out = pack_path(name, parts)
    members = pack(tree, out)
    print(f"shards: {name}: parked {len(members)} files to {out} (commit it; `run {name}` resumes it)",
          file=sys.stderr)
    return out


RETIMING = "RETIMING"   # marker in a retime's tree: what it re-times (a rerun resumes it)


def _phase(run_dir: Path) -> str | None:
    """The phase a run directory's records name (a study's 'quality' or 'timed'; None: a plain run)."""
    from mars_bench.store.io import read_samples

    recs = read_samples(run_dir / "samples.jsonl")[0]
    return recs[0].get("phase") if recs else None


def retime(name: str, shards: dict[str, Shard] | None = None, runs: Path = RUNS, packs: Path = PACKS,
           extra: tuple[str, ...] = (), cwd: Path | None = None) -> Path:
    """Decode a packed shard's timed phase again on this machine and replace its pack: the quality phase's runs
    are kept as packed (their samples are done, so the shard's commands resume past them), the timed phase's run
    directories are left out and decoded anew (its samples, sizes and order are the shard's: ``timed_min`` =
    ``timed_max``). For putting every timed phase of a table on one kind of machine, or re-timing a phase timed
    beside other work. Runs in ``runs/<name>.retime``; an interrupted retime resumes there; the pack is replaced
    only when the commands finish (the old one stays in git's history). The records then name two commits and
    machines, one per phase, and the report says so (``report.study.phase_commit_notes``; Table 8's 'timed on').
    ValueError (nothing written) for a shard without a pack or without a timed phase (a plain batch-size-1 run:
    rerun it with ``run`` in a fresh tree)."""
    from mars_bench.store.pack import pack, unpacked
    from mars_bench.store.read import find_run_dirs

    shards = SHARDS if shards is None else shards
    if name not in shards:
        raise InputError(f"shard {name!r}; allowed: {', '.join(shards)}")
    out = pack_path(name, packs)
    if not out.is_file():
        raise InputError(f"shard {name!r} has no pack ({out}); allowed: a packed shard (`run {name}` writes it)")
    tree = Path(runs) / f"{name}.retime"
    if (tree / RETIMING).is_file():
        print(f"shards: {name}: resuming the retime in {tree}", file=sys.stderr)
    else:
        with unpacked(out) as root:
            dirs = find_run_dirs(root)
            timed = [d for d in dirs if _phase(d) == "timed"]
            if not timed:
                raise InputError(f"shard {name}'s pack {out} has no timed phase (its runs are plain batch-size-1 "
                                 f"runs); allowed: a study's shard (one of "
                                 f"{', '.join(n for n in shards if n != name)}), or `run` it again in a fresh tree")
            staging = tree.with_name(tree.name + ".staging")   # the tree is written whole or not at all
            shutil.rmtree(staging, ignore_errors=True)
            shutil.copytree(root, staging)
            for d in timed:
                shutil.rmtree(staging / d.relative_to(root))
            (staging / RETIMING).write_text(f"{out}: timed phase re-timed; {len(timed)} timed runs left out\n")
        shutil.rmtree(tree, ignore_errors=True)
        staging.replace(tree)
        print(f"shards: {name}: re-timing {len(timed)} timed runs of {out} in {tree}", file=sys.stderr)
    prepare(name, shards[name], cwd)
    for args in shards[name].commands:
        cmd = [sys.executable, "-m", "mars_bench.cli", *args, *extra, f"results_dir={tree}"]
        print(f"shards: {name}: {' '.join(cmd[2:])}", file=sys.stderr)
        subprocess.run(cmd, check=True, cwd=cwd)
    keep_quality(out, tree)
    members = pack(tree, out)
    (tree / RETIMING).unlink()
    print(f"shards: {name}: re-timed; packed {len(members)} files to {out} (commit it)", file=sys.stderr)
    return out


def keep_quality(old: Path, tree: Path) -> None:
    """Put back, in a retime's ``tree``, every file of the runs ``old`` (the pack being re-timed) holds outside its
    timed phase, as packed: resuming past their finished samples rewrote their summary.json with this process's
    manifest, which would name this commit as theirs. RuntimeError when such a run's samples differ from the pack's
    (the resume decoded something: not a retime's)."""
    from mars_bench.store.pack import RUN_FILES, unpacked
    from mars_bench.store.read import find_run_dirs

    with unpacked(old) as root:
        for d in find_run_dirs(root):
            if _phase(d) == "timed":
                continue
            here = Path(tree) / d.relative_to(root)
            if (here / "samples.jsonl").read_bytes() != (d / "samples.jsonl").read_bytes():
                raise RuntimeError(f"{here}: its samples differ from {old}'s after the retime; a retime keeps the "
                                   "quality phase as packed")
            for name in RUN_FILES:
                if (d / name).is_file():
                    shutil.copyfile(d / name, here / name)


def _has_samples(tree: Path) -> bool:
    return tree.is_dir() and any(tree.rglob("samples.jsonl"))


def part_origin(part: Path) -> tuple[list[str], list[dict]]:
    """The commits and the machines (distinct, in order of first record) named by the records of a part."""
    from mars_bench.store.pack import unpacked

    with unpacked(part) as root:
        return _origin(root)


def _origin(root: Path) -> tuple[list[str], list[dict]]:
    """The commits and machines the records under ``root`` name (a line torn by a kill is skipped: resuming cuts
    it off and decodes that sample again)."""
    from mars_bench.store.io import read_samples

    commits, machines = [], []
    for path in sorted(Path(root).rglob("samples.jsonl")):
        for rec in read_samples(path)[0]:
            if rec.get("commit") not in commits:
                commits.append(rec.get("commit"))
            if rec.get("machine") not in machines:
                machines.append(rec.get("machine"))
    return commits, machines


def _kind(m: dict | None) -> tuple:
    """A machine's kind: what decides its kernels and tokens (CPU model with family and model numbers,
    instruction sets, GPU); thread counts are the run's own settings."""
    m = m or {}
    return m.get("cpu"), tuple(m.get("isa") or ()), m.get("gpu")


def _check_origin(name: str, part: Path, commits: list, machines: list) -> None:
    """PartMismatch when a part's records name a commit whose decoding code is not this tree's, or a machine of
    another kind than this one."""
    from mars_bench.store.provenance import machine, machine_label

    other = [c for c in commits if not same_code(c)]
    if other:
        raise PartMismatch(f"shard {name}'s part {part} holds records decoded at {other[0]}, whose decoding code "
                           f"is not this tree's (git diff {other[0]} -- {' '.join(DECODING)}); allowed: resume it "
                           "from a clean clone at that commit (the part copied there), or --allow-mixed (the "
                           "records then name both)")
    here = machine("cuda" if any((m or {}).get("gpu") for m in machines) else "cpu")
    away = [m for m in machines if _kind(m) != _kind(here)]
    if away:
        raise PartMismatch(f"shard {name}'s part {part} was decoded on {machine_label(away[0])}, this machine is "
                           f"{machine_label(here)}; allowed: a machine of that kind, or --allow-mixed (speedups "
                           "then pair only records of equal machines)")


def restore(name: str, runs: Path = RUNS, parts: Path = PARTS, allow_mixed: bool = False) -> bool:
    """Unpack shard ``name``'s part into ``runs/<name>`` when there is a part and no records there; False when
    nothing was restored. PartMismatch (nothing written) when the part's records name a commit whose decoding
    code differs from this tree's, or another kind of machine, unless ``allow_mixed``."""
    part, tree = pack_path(name, parts), Path(runs) / name
    if not part.is_file():
        return False
    if _has_samples(tree):
        print(f"shards: {name}: resuming {tree} (here already; {part} not unpacked)", file=sys.stderr)
        return False
    from mars_bench.store.pack import unpacked

    with unpacked(part) as root:
        commits, machines = _origin(root)
        if not allow_mixed:
            _check_origin(name, part, commits, machines)
        staging = tree.with_name(tree.name + ".restoring")   # the tree is written whole or not at all
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(root, staging)
    shutil.rmtree(tree, ignore_errors=True)   # no records in it (checked above)
    staging.replace(tree)
    print(f"shards: {name}: resuming from {part} (records of {', '.join(map(str, commits))})", file=sys.stderr)
    return True


def shard_of(path) -> str | None:
    """The shard a pack is, by its file name (``<name>.tar.xz``); None for any other root."""
    name = Path(str(path)).name
    return name[:-len(".tar.xz")] if name.endswith(".tar.xz") else None


def missing(roots, shards: dict[str, Shard] | None = None) -> list[str] | None:
    """The shards not among ``roots`` when at least one root is a shard's pack; None when none is (not a
    sharded study)."""
    shards = SHARDS if shards is None else shards
    given = {shard_of(r) for r in roots} & set(shards)
    return [s for s in shards if s not in given] if given else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mars_bench.run.shards", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="each shard: name, estimated minutes (AMX machine), what it runs")
    r = sub.add_parser("run", help="run or resume shards, then pack each")
    r.add_argument("names", nargs="*")
    r.add_argument("--all", action="store_true", help="every shard (those packed already are skipped)")
    r.add_argument("--allow-dirty", action="store_true", help="run from a tree with uncommitted changes")
    r.add_argument("--allow-mixed", action="store_true",
                   help="resume a part decoded by other code or another kind of machine")
    r.add_argument("--runs", default=str(RUNS), help=f"results trees (default {RUNS})")
    r.add_argument("--packs", default=str(PACKS), help=f"packs (default {PACKS})")
    r.add_argument("--parts", default=str(PARTS), help=f"parked shards (default {PARTS})")
    k = sub.add_parser("park", help="pack a stopped shard's records to resume at another sitting")
    k.add_argument("name")
    k.add_argument("--runs", default=str(RUNS), help=f"results trees (default {RUNS})")
    k.add_argument("--parts", default=str(PARTS), help=f"parked shards (default {PARTS})")
    k.add_argument("--packs", default=str(PACKS), help=f"packs (default {PACKS})")
    t = sub.add_parser("retime", help="decode packed shards' timed phases again here, then repack each")
    t.add_argument("names", nargs="+")
    t.set_defaults(all=False)
    t.add_argument("--allow-dirty", action="store_true", help="run from a tree with uncommitted changes")
    t.add_argument("--runs", default=str(RUNS), help=f"results trees (default {RUNS})")
    t.add_argument("--packs", default=str(PACKS), help=f"packs (default {PACKS})")
    c = sub.add_parser("check-clean", help="exit 2 when the tree has uncommitted changes")
    c.add_argument("--allow-dirty", action="store_true")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = ap.parse_args(argv[:cut]), tuple(argv[cut + 1:])   # after --: overrides for every command
    try:
        if args.cmd == "list":
            for name, s in SHARDS.items():
                print(f"{name}\t{s.est_min:.0f} min\t{s.what}")
            print(f"total\t{sum(s.est_min for s in SHARDS.values()):.0f} min (2-core Intel Xeon with AMX; module doc)")
            return 0
        if args.cmd == "park":
            park(args.name, Path(args.runs), Path(args.parts), Path(args.packs))
            return 0
        check_clean(args.allow_dirty)
        if args.cmd == "check-clean":
            return 0
        names = list(SHARDS) if args.all else args.names
        unknown = [n for n in names if n not in SHARDS]
        if not names or unknown:
            raise InputError(f"shard {unknown[0] if unknown else 'none'!r}; allowed: "
                             f"{'' if args.cmd == 'retime' else '--all or '}one or more of {', '.join(SHARDS)}")
        for name in names:
            if args.cmd == "retime":
                retime(name, runs=Path(args.runs), packs=Path(args.packs), extra=extra)
                continue
            run_shard(name, runs=Path(args.runs), packs=Path(args.packs), extra=extra, parts=Path(args.parts),
                      allow_mixed=args.allow_mixed)
    except (InputError, DirtyTree, PartMismatch) as e:   # bad input: one line; a bug keeps its traceback
        print(f"shards: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
