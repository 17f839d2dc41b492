"""What the report shows where: its sections (one per question), the tables and figures in each, and from which
phase of a study each figure is drawn. ``report.md`` and ``report.html`` (``html.py``) both follow it.

    SECTIONS                 speed, quality, theta, fidelity, claims: (key, title, question, table names)
    make_figures(...)        the paths ``draw`` wrote
    draw(frames, out, theta) every figure once, for the phase that answers its question, saved as PNG and PDF;
                             returns ``Drawn`` records (section, caption, files)
    page_tables(runs, theta) the tables the pages show: a study's runs once, for the phase that answers each question
    sections(tables, drawn)  the sections that hold a table with rows or a figure, in order

Figures of a study (runs written by ``+study``, ``frames.study_pairs``): speed (speedup and τ per method, the θ
sensitivity, the rules frontier) from its phases joined (``frames.study_groups``: speedup from the timed batch-size-1
phase, τ and quality from the quality phase's every sample); acceptance per depth, fidelity and the logit figures
from the quality phase (every sample). The timed phase's own group draws nothing more: its numbers are in the
joined figures. Runs outside a study draw every figure from their group.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from mars_bench.report.figures import (FIGURES, logit_run, r_distribution, save, slug, speedup_tau, theta_sensitivity,
                                       rules_frontier, z1_histogram)
from mars_bench.report.frames import DEFAULT_THETA, groups, study_groups
from mars_bench.report.writer import Table

SECTIONS = (
    ("speed", "Speed", "How much faster than ar is each method, and how many tokens does each target forward "
     "commit (τ)?", ("study", "paper_ours", "paper_authors", "main", "acceptance", "costs")),
    ("quality", "Quality", "Does a method change the output's quality against ar (paired on the same samples)?",
     ("quality",)),
    ("theta", "θ", "How do speed, τ and quality move with θ (and with each rule's knob)?", ("theta", "rules")),
    ("fidelity", "Fidelity", "How close are a method's outputs to ar's?", ("fidelity",)),
    ("claims", "Claims", "Which of the paper's claims do this study's intervals resolve?", ("claims",)),
)
SECTION_OF = {"speedup_tau": "speed", "acceptance_by_depth": "speed", "theta_sensitivity": "theta",   # in order
              "rules_frontier": "theta", "r_distribution": "theta", "z1_histogram": "theta",
              "fidelity_vs_theta": "fidelity"}
WHAT = {"speedup_tau": "Speedup over ar and τ per method, with 95% CIs.",
        "acceptance_by_depth": "Acceptance rate per draft position.",
        "theta_sensitivity": "Speedup, τ and the paired quality change vs ar against θ; the non-inferiority margin "
                             "dotted, a red star where the change is significant.",
        "rules_frontier": "Verification rules: speedup against the quality change and against chrF to ar, one line "
                          "per rule through its knob.",
        "r_distribution": "Distribution of r = z2/z1 at the verified positions, θ marked (what mars relaxes).",
        "z1_histogram": "Histogram of the target's top logit z1 at the verified positions.",
        "fidelity_vs_theta": "Outputs identical to ar, first divergence and chrF to ar against θ."}
SPEED_FIGURES = ("speedup_tau", "theta_sensitivity", "rules_frontier")   # a study's: from its phases joined


@dataclass
class Drawn:
    name: str            # the figure's kind (a key of FIGURES, or a logit figure)
    section: str         # a SECTIONS key
    caption: str
    paths: list[Path]    # its PNG and PDF

    @property
    def png(self) -> Path:
        return self.paths[0]


def _phase_note(phases: set) -> str:
    if phases == {"quality"}:
        return " Study, quality phase: every sample, batched."
    return ""


def draw(frames, out_dir, theta: float = DEFAULT_THETA) -> list[Drawn]:
    """Every figure once, for the phase that answers it (module doc), as ``<out_dir>/<figure>__<group>.{png,pdf}``."""
    import matplotlib

    from mars_bench.report.figures import plt_rc

    out: list[Drawn] = []
    out_dir = Path(out_dir)

    def keep(name: str, fig, stem: str, caption: str) -> None:
        if fig is not None:
            out.append(Drawn(name, SECTION_OF[name], caption, save(fig, out_dir / stem)))

    with matplotlib.rc_context(plt_rc):
        for group in groups(frames.runs).values():
            phases = set(group["phase"].dropna())
            if "timed" in phases:      # a study's timed phase: drawn joined with its quality phase below
                continue
            first, note = group.iloc[0], _phase_note(phases)
            for name, fn in FIGURES.items():
                if not (phases and name in SPEED_FIGURES):
                    keep(name, fn(group, theta), f"{name}__{slug(first)}", f"{WHAT[name]} {first['title']}, "
                         f"{first['settings_label']}.{note}")
            run = logit_run(group, frames.samples, theta)
            if run is not None:
                for name, fig in (("r_distribution", r_distribution(run, frames.samples, theta)),
                                  ("z1_histogram", z1_histogram(run, frames.samples))):
                    keep(name, fig, f"{name}__{slug(first)}", f"{WHAT[name]} {run['label']}, {first['title']}, "
                         f"{first['settings_label']}.{note}")
        for group in study_groups(frames.runs).values():
            first, n_timed = group.iloc[0], int(group["n_timed"].max())
            joined = (f" Study, phases joined: speedup from the first {n_timed} samples timed at batch size 1, τ and "
                      f"quality from every sample (batched). {first['title']}.")
            keep("speedup_tau", speedup_tau(group, theta), f"speedup_tau__{slug(first)}",
                 WHAT["speedup_tau"] + joined)
            keep("theta_sensitivity", theta_sensitivity(group, theta, what=f"study: τ and quality from every sample "
                                                        f"(batched), speedup from the first {n_timed} timed at B = 1"),
                 f"study_theta__{slug(first)}", WHAT["theta_sensitivity"] + joined)
            keep("rules_frontier", rules_frontier(group, theta), f"rules_frontier__{slug(first)}",
                 WHAT["rules_frontier"] + joined)
    return out


def make_figures(frames, out_dir, theta: float = DEFAULT_THETA) -> list[Path]:
    """``draw``'s files: every figure once, for the phase that answers it."""
    return [p for d in draw(frames, out_dir, theta) for p in d.paths]


def page_tables(runs, theta: float = DEFAULT_THETA) -> dict[str, Table]:
    """The tables the pages show: every table of ``runs`` (``tables.all_tables``), but where a study is among them its
    runs appear once, for the phase that answers each question: speed and θ from the study table (its phases joined),
    so the per-run speed, θ and rules tables keep the runs outside a study; quality, acceptance and fidelity from the
    quality phase (every sample), without the timed phase's subset. The files under tables/ keep every run."""
    from mars_bench.report.tables import all_tables

    every = all_tables(runs, theta)
    if every["study"].empty:
        return every
    outside, untimed = runs[runs["phase"].isna()], runs[runs["phase"] != "timed"]
    picked = all_tables(outside, theta)
    for name, t in all_tables(untimed, theta).items():
        if name in ("quality", "acceptance", "fidelity"):
            picked[name] = t
    for name in ("study", "paper_ours", "paper_authors", "claims", "costs"):   # costs: the timed phase's records
        picked[name] = every[name]
    return picked


def sections(tables: dict[str, Table], drawn: list[Drawn]) -> list[tuple[str, str, str, list, list[Drawn]]]:
    """(key, title, question, [(name, table)] of the tables with rows, figures) per section that has either, in
    SECTIONS' order."""
    out = []
    for key, title, question, names in SECTIONS:
        ts = [(n, tables[n]) for n in names if n in tables and not tables[n].empty]
        figs = sorted((d for d in drawn if d.section == key), key=lambda d: list(SECTION_OF).index(d.name))
        if ts or figs:
            out.append((key, title, question, ts, figs))
    return out
