"""``method.topk_q``: how sampled tree verification sees a top-k child (onehot, lossless | draft, the MARS
authors' q). Its run-tag part, its effect on what counts as lossless, its validation, and the
paper_trees experiment that uses it. The distributional checks are in test_tree_mc.py."""
import pytest
from hydra import compose, initialize_config_dir

from mars_bench.config.spec import spec_of
from mars_bench.base.errors import ConfigError
from mars_bench.config import schema as C
from mars_bench.config.validation import validate
from mars_bench.run import runner as R
from mars_bench.store.spec import RunSpec

from .conftest import ROOT, data_dir

C.register()


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


@pytest.mark.parametrize("tag", [
    "sd_tree-d4-w4-t16-qdraft-T1-p1-n8-s0", "mars_tree-d4-w4-t16-qdraft-th0.9-ratio-margin-T1-p1-n8-s0",
    "mars_tree-paths0a1b2c3d-qdraft-th0.84-T0.2-p1-n8-s3", "eagle3_mars-d5-w4-t16-qdraft-th0.9-nucleusallow-T1-p0.9-n8-s0"])
def test_qdraft_tags_round_trip(tag):
    t = RunSpec.parse(tag)
    assert t.topk_q == "draft" and t.label == tag


def test_qdraft_is_never_a_lossless_reference():
    sd_draft = RunSpec.parse("sd_tree-d4-w4-t16-qdraft-T1-p1-n8-s0")
    sd_onehot = RunSpec.parse("sd_tree-d4-w4-t16-T1-p1-n8-s0")
    mars_draft = RunSpec.parse("mars_tree-d4-w4-t16-qdraft-th0.9-T1-p1-n8-s0")
    assert sd_onehot.lossless and sd_onehot.lossless_reference() is None
    assert not sd_draft.lossless and not mars_draft.lossless
    assert sd_draft.lossless_reference() == sd_onehot
    assert mars_draft.lossless_reference() == sd_onehot
    assert RunSpec.parse("mars_tree-d4-w4-t16-th0.9-T1-p1-n8-s0").lossless_reference() == sd_onehot


@pytest.mark.parametrize("temperature,children,part", [(1, "topk", True), (0.2, "topk", True), (0, "topk", False)])
def test_tag_of_a_config_shows_qdraft_only_where_it_changes_outputs(temperature, children, part):
    """Greedy verification never reads q, so a greedy run with topk_q=draft is the greedy run."""
    cfg = cfg_of("model=tiny", "method=mars_tree", "method.topk_q=draft", f"temperature={temperature}",
                 f"method.children={children}")
    validate(cfg)
    name = spec_of(cfg, 8).label
    assert ("-qdraft-" in name) == part
    assert "-qdraft-" not in spec_of(cfg_of("model=tiny", "method=mars_tree", f"temperature={temperature}"),
                                                8).label


@pytest.mark.parametrize("overrides,needle", [
    (["method.topk_q=beta"], "method.topk_q='beta'; allowed: onehot, draft"),
    (["method.topk_q=draft", "method.children=sample"], "allowed with children=sample: onehot"),
])
def test_bad_topk_q_is_one_line_before_anything_runs(tmp_path, overrides, needle):
    cfg = cfg_of("model=tiny", "method=sd_tree", "temperature=1", f"results_dir={tmp_path / 'r'}",
                 f"data_dir={data_dir()}", *overrides)
    with pytest.raises(ConfigError) as e:
        R.prepare(cfg)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("temperature", ["1.0", "0.2"])
def test_paper_trees_experiment_entries(temperature):
    """Every entry of the experiment is a valid, distinct run; exactly one is a lossless reference
    (sd_tree, onehot), and it is the reference of every other speculative entry."""
    base = ["+experiment=paper_trees", "task=wmt19_zh_en", f"temperature={temperature}"]
    cfg = cfg_of(*base)
    entries = [list(e) for e in cfg.interleave]
    tags = []
    for entry in entries:
        v = cfg_of(*base, *entry)
        validate(v)
        tags.append(spec_of(v, 256))
    names = [t.label for t in tags]
    assert len(set(names)) == len(names)
    spec = [t for t in tags if t.scheme != "ar"]
    (ref,) = [t for t in spec if t.lossless]
    assert ref.scheme == "sd_tree" and ref.tree == "d4-w4-t16" and ref.temperature == float(temperature)
    assert all(t.lossless_reference() == ref for t in spec if t is not ref)
    thetas = {t.topk_q: sorted(x.settings["theta"] for x in spec if x.rule == "mars" and x.topk_q == t.topk_q)
              for t in spec}
    assert thetas["draft"] == thetas["onehot"] and len(thetas["draft"]) >= 5
    assert all(t.settings.get("sampled_top1") == "margin" for t in spec if t.rule == "mars")


def _entry_specs(experiment: str) -> list:
    """The run spec of each interleave entry of ``experiment`` on WMT19, each entry's config validated."""
    base = [f"+experiment={experiment}", "task=wmt19_zh_en"]
    specs = []
    for entry in [list(e) for e in cfg_of(*base).interleave]:
        v = cfg_of(*base, *entry)
        validate(v)
        specs.append(spec_of(v, 256))
    return specs


def test_trees_t1_shapes_experiment_entries():
    """The T = 1 shapes bench: every entry valid and distinct, all at T = 1 with the authors' rule settings; the
    lossless entries are the chain, sampled-children trees of widths 1 / 2 / 4 and point-mass trees of widths 2 / 4;
    the MARS entries are the chain, paper_trees' d4 w4 t16 tree (point-mass q) and the sampled d3 w2 t8 tree, theta
    0.9, MARS alone."""
    tags = _entry_specs("trees_t1_shapes")
    assert len({t.label for t in tags}) == len(tags)
    assert all(t.temperature == 1.0 and t.top_p == 1.0 for t in tags)
    lossless = sorted((t.scheme, t.tree or "", t.sample_children) for t in tags if t.scheme != "ar" and t.lossless)
    assert [(s, c) for s, _, c in lossless].count(("sd_tree", True)) == 3
    assert [(s, c) for s, _, c in lossless].count(("sd_tree", False)) == 2
    assert ("sd", "", False) in [(s, tr, bool(c)) for s, tr, c in lossless]
    mars = [t for t in tags if t.rule == "mars"]
    assert sorted(t.scheme for t in mars) == ["sd", "sd_tree", "sd_tree"]   # the drafting scheme; the rule is mars
    assert all(t.settings["theta"] == 0.9 and t.settings.get("sampled_top1") == "margin" for t in mars)
    assert all(t.topk_q in (None, "onehot") for t in mars)
    sampled = [t for t in mars if t.sample_children]   # MARS on the best lossless drafting: its exact twin is there
    assert len(sampled) == 1 and sampled[0].lossless_reference() in tags


def test_study_trees_t1_pairs_every_mars_tree_with_its_own_drafting_verified_exactly():
    """The paper's main setting (study_trees_t1): entries valid and distinct, at T = 1; MARS alone's entries (point-
    mass q) have their lossless reference (the same tree, rule exact) among the entries, so the report's paired
    'faster than' claim reads the rule's effect alone; the best lossless tree and the authors' baseline are there."""
    specs = _entry_specs("study_trees_t1")
    assert len({s.label for s in specs}) == len(specs) == 15
    assert all(s.temperature == 1.0 for s in specs)
    alone = [s for s in specs if s.rule == "mars" and s.topk_q == "onehot"]
    assert len(alone) == 5 and all(s.lossless_reference() in specs for s in alone)
    assert any(s.scheme == "sd_tree" and s.sample_children and s.lossless for s in specs)
    assert any(s.scheme == "sd_tree" and s.topk_q == "draft" and s.rule == "exact" for s in specs)
