"""The `protocol` group (ours | authors): named system prompts, the authors' budget rule in every decode
loop, Qwen3's enable_thinking switch, run identity of each setting, and bad input."""
import json
from itertools import accumulate
from pathlib import Path

import pytest

from mars_bench.config.spec import spec_of
from mars_bench.base.errors import ConfigError
from mars_bench.config.settings import max_new_tokens_of
from mars_bench.config.overrides import check_overrides
from mars_bench.config.validation import validate
from mars_bench.run import runner as R
from mars_bench.decode import DecodeConfig, Method, generate
from mars_bench.decode.generate import Request, generate_batch
from mars_bench.decode.tree.build import TreeSpec
from mars_bench.decode.generate import generate as generate_tree
from mars_bench.models.pairs import Pair, chat_template_kwargs
from mars_bench.models.tiny import CHAT_TEMPLATE, tiny_tokenizer
from mars_bench.tasks.system_prompts import SYSTEM_PROMPTS
from mars_bench.store.spec import RunSpec, read_spec
from mars_bench.tasks import Sample, build_messages, get_task

from .test_cli import cfg_of, tiny_cfg

# The opening of the LLaMA-2 system prompt, as the authors' gen_ea_answer_*.py scripts write it.
LLAMA2_OPENING = "You are a helpful, respectful and honest assistant. Always answer as helpfully as possible, while being safe.  "
# A Qwen3-style template: with enable_thinking false, the generation prompt carries an empty think block.
THINK_TEMPLATE = CHAT_TEMPLATE.replace(
    "<|im_start|>assistant\n{% endif %}",
    "<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}"
    "<think>\n\n</think>\n\n{% endif %}{% endif %}")


def _steps(res) -> list[int]:
    """Tokens committed after each step: accepted drafts + 1."""
    return list(accumulate(a + 1 for a in res.accepted))


def _check_after_step(res, budget: int, most_per_step: int) -> None:
    """Whole steps: the output ends at the first step boundary past the budget, at most one step over."""
    ends = _steps(res)
    assert ends[-1] == len(res.tokens) and res.stop_reason == "max_new_tokens"
    assert budget < len(res.tokens) <= budget + most_per_step
    assert all(e <= budget for e in ends[:-1])


# ---- the composed protocol ------------------------------------------------------------------------------
def test_authors_protocol_settings_and_budgets():
    ours, authors = cfg_of(), cfg_of("protocol=authors")
    assert (ours.protocol.system_prompt, ours.protocol.budget, ours.protocol.task_prompts) == ("none", "exact", "ours")
    assert (authors.protocol.system_prompt, authors.protocol.budget, authors.protocol.task_prompts) == (
        "llama2", "after_step", "authors")
    validate(authors)
    wmt = get_task("wmt19_zh_en").max_new_tokens
    assert max_new_tokens_of(ours, wmt) == wmt == 256
    from mars_bench.tasks import TASKS

    for name in TASKS:   # eagenerate / naivegenerate's default budget, for every task
        assert max_new_tokens_of(authors, get_task(name).max_new_tokens) == 512
    assert max_new_tokens_of(cfg_of("protocol=authors", "max_new_tokens=64"), wmt) == 64   # the command wins
    assert cfg_of("model=qwen3_0.6b_32b").model.enable_thinking is False
    assert cfg_of().model.enable_thinking is None


def test_authors_protocol_runs_end_to_end_in_its_own_run_dirs(tmp_path):
    base = ("limit=2",)   # tiny_cfg: max_new_tokens=24
    ar = R.run(tiny_cfg(tmp_path, "protocol=authors", "method=ar", *base))
    mars = R.run(tiny_cfg(tmp_path, "protocol=authors", "method=mars", *base))
    ours = R.run(tiny_cfg(tmp_path, "method=mars", *base))
    assert read_spec(mars["run_dir"]).label == "mars-k4-th0.9-sysllama2-afterstep-T0-p1-n24-s0"
    assert read_spec(ar["run_dir"]).label == "ar-sysllama2-afterstep-T0-p1-n24-s0"
    assert read_spec(ours["run_dir"]).label == "mars-k4-th0.9-T0-p1-n24-s0"
    assert Path(ours["run_dir"]).name != Path(mars["run_dir"]).name
    assert mars["speedup"]["n_common"] == 2   # compared with the ar run under the same protocol
    tok = tiny_tokenizer()
    recs = {p: [json.loads(x) for x in (Path(s["run_dir"]) / "samples.jsonl").read_text().splitlines()]
            for p, s in (("ar", ar), ("mars", mars), ("ours", ours))}
    assert SYSTEM_PROMPTS["llama2"].startswith(LLAMA2_OPENING)
    for rec_a, rec_o in zip(recs["mars"], recs["ours"]):
        user = {"role": "user", "content": get_task("prompts").load(None, limit=2)[rec_a["index"]].turns[0]}
        system = {"role": "system", "content": SYSTEM_PROMPTS["llama2"]}
        for rec, msgs in ((rec_a, [system, user]), (rec_o, [user])):
            assert rec["turns"][0]["prompt_tokens"] == len(tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                                                   return_dict=False))
    for rec in recs["ar"]:   # one token a step: ends one past the budget, as their naivegenerate does
        assert rec["new_tokens"] == 25 or rec["turns"][0]["stop_reason"] != "max_new_tokens"
    for rec in recs["mars"]:
        t = rec["turns"][0]
        if t["stop_reason"] == "max_new_tokens":
            assert 24 < t["new_tokens"] <= 24 + 4 + 1
    assert all(r["new_tokens"] <= 24 for r in recs["ours"])
    assert "name: authors" in (Path(mars["run_dir"]) / "config.yaml").read_text()


def test_task_prompts_option_reaches_the_task_and_the_tag(tmp_path):
    authors = tiny_cfg(tmp_path, "protocol=authors", "task=gsm8k", "limit=1", "method=sd")
    task, *_ = R.prepare(authors)
    assert task.options["prompts"] == "authors"
    job = R.Job(authors)
    assert job.tag.task_prompts == "authors" and job.tag.label.endswith("-promptsauthors-T0-p1-n24-s0")
    assert job.tag.baseline().label == "ar-sysllama2-afterstep-promptsauthors-T0-p1-n24-s0"
    ours = R.Job(tiny_cfg(tmp_path, "task=gsm8k", "limit=1", "method=sd"))
    assert ours.task.options["prompts"] == "ours" and "prompts" not in ours.tag.label
    no_option = R.Job(tiny_cfg(tmp_path, "protocol=authors", "limit=1"))   # the built-in set has no such option
    assert "prompts" not in no_option.task.options and "prompts" not in no_option.tag.label


def test_build_messages_puts_the_system_prompt_first():
    task = get_task("prompts", system_prompt=SYSTEM_PROMPTS["llama2"])
    sample = Sample("s", ["first question", "second question"], None)
    msgs = build_messages(task, sample, ["first answer"], 1)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith(LLAMA2_OPENING) and msgs[-1]["content"] == "second question"
    assert build_messages(get_task("prompts"), sample, [], 0) == [{"role": "user", "content": "first question"}]


# ---- the budget rule in each decode loop --------------------------------------------------------------
@pytest.mark.parametrize("budget", [5, 13])
def test_after_step_chain_commits_whole_steps(tiny, prompt_ids, budget):
    """k=4: the output passes max_new_tokens by at most k + 1 and ends at the first step boundary past it;
    drafts are never shortened; greedy sd with rule exact stays the target's greedy continuation; exact
    never exceeds the budget."""
    target, draft, tok = tiny
    k = 4
    after = DecodeConfig(max_new_tokens=budget, budget="after_step")
    over = 0
    for ids in prompt_ids[:8]:
        ref = generate(target, None, tok, ids, Method("ar"), DecodeConfig(max_new_tokens=budget + k + 1)).tokens
        ar = generate(target, None, tok, ids, Method("ar"), after)
        assert ar.tokens == ref[: budget + 1] and ar.steps == budget + 1
        for m in (Method("sd", k=k), Method("mars", k=k, rule_kwargs={"theta": 0.6})):
            res = generate(target, draft, tok, ids, m, after)
            _check_after_step(res, budget, k + 1)
            assert set(res.proposed) == {k}
            if m.rule == "exact":
                assert res.tokens == ref[: len(res.tokens)]
            over = max(over, len(res.tokens) - budget)
            exact = generate(target, draft, tok, ids, m, DecodeConfig(max_new_tokens=budget))
            assert len(exact.tokens) == budget and _steps(exact)[-1] == budget
    assert over > 1   # some step really overshot by more than ar's one token


def test_after_step_keeps_eos_and_stop_strings_first(tiny, prompt_ids):
    target, draft, tok = tiny
    ref = generate(target, None, tok, prompt_ids[0], Method("ar"), DecodeConfig(max_new_tokens=12)).tokens
    cfg = DecodeConfig(max_new_tokens=40, eos_ids=(ref[6],), budget="after_step")
    res = generate(target, draft, tok, prompt_ids[0], Method("sd", k=4), cfg)
    assert res.tokens == ref[: ref.index(ref[6]) + 1] and res.stop_reason == "eos"


def test_after_step_batch_equals_batch1(tiny, prompt_ids):
    target, draft, tok = tiny
    budget, k = 11, 4
    cfg = DecodeConfig(max_new_tokens=budget, budget="after_step")
    for m in (Method("ar"), Method("sd", k=k), Method("mars", k=k, rule_kwargs={"theta": 0.6})):
        got = {}

        def done(req, res):
            got[req.key] = res

        generate_batch(target, draft if m.speculative else None, tok,
                       [Request(ids, key=i) for i, ids in enumerate(prompt_ids[:6])], m, cfg, 2, done)
        for i, ids in enumerate(prompt_ids[:6]):
            alone = generate(target, draft, tok, ids, m, cfg)
            assert got[i].tokens == alone.tokens and got[i].accepted == alone.accepted
            if m.speculative:
                _check_after_step(got[i], budget, k + 1)
            else:
                assert len(got[i].tokens) == budget + 1
        exact = {}
        generate_batch(target, draft if m.speculative else None, tok,
                       [Request(ids, key=i) for i, ids in enumerate(prompt_ids[:6])], m,
                       DecodeConfig(max_new_tokens=budget), 2, lambda req, res: exact.__setitem__(req.key, res))
        assert all(len(r.tokens) == budget for r in exact.values())


@pytest.mark.parametrize("spec", [TreeSpec(depth=3, top_k=3, total_tokens=12), TreeSpec(depth=4, top_k=1, total_tokens=6)])
def test_after_step_tree_commits_whole_steps(tiny, prompt_ids, spec):
    target, draft, tok = tiny
    budget = 9
    after = DecodeConfig(max_new_tokens=budget, budget="after_step")
    for ids in prompt_ids[:6]:
        ref = generate(target, None, tok, ids, Method("ar"),
                       DecodeConfig(max_new_tokens=budget + spec.max_depth + 1)).tokens
        res = generate_tree(target, draft, tok, ids, Method("sd_tree"), after, tree=spec)
        _check_after_step(res, budget, spec.max_depth + 1)
        assert res.tokens == ref[: len(res.tokens)]   # greedy, rule exact: the target's own continuation
        exact = generate_tree(target, draft, tok, ids, Method("sd_tree"), DecodeConfig(max_new_tokens=budget), tree=spec)
        assert exact.tokens == ref[:budget]


def test_unknown_budget_rule_is_refused():
    with pytest.raises(ValueError, match="budget='soft'; allowed: exact, after_step"):
        DecodeConfig(max_new_tokens=8, budget="soft")


# ---- enable_thinking -----------------------------------------------------------------------------------
def test_enable_thinking_false_reaches_the_chat_template():
    tok = tiny_tokenizer()
    tok.chat_template = THINK_TEMPLATE
    msgs = [{"role": "user", "content": "hi"}]
    off = Pair(None, None, tok, chat_kwargs=chat_template_kwargs(tok, False, "qwen3-like")).prompt_ids(msgs)
    default = Pair(None, None, tok, chat_kwargs=chat_template_kwargs(tok, None, "qwen3-like")).prompt_ids(msgs)
    assert tok.decode(off).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert tok.decode(default).endswith("<|im_start|>assistant\n")
    assert chat_template_kwargs(tok, True, "qwen3-like") == {"enable_thinking": True}


def test_enable_thinking_without_the_switch_fails_before_weights_load(tmp_path, monkeypatch):
    from mars_bench.models import tiny

    def no_weights(*a, **kw):
        raise AssertionError("weights were built before the chat template was checked")

    monkeypatch.setattr(tiny, "tiny_pair", no_weights)
    with pytest.raises(ConfigError) as e:
        R.run(tiny_cfg(tmp_path / "r", "model.enable_thinking=false", "limit=1"))
    msg = str(e.value)
    assert "model.enable_thinking=false" in msg and "allowed" in msg and "\n" not in msg
    assert not (tmp_path / "r").exists()


# ---- run identity --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [
    "mars-k4-th0.9-sysllama2-afterstep-T0-p1-n512-s0",
    "ar-sysllama2-afterstep-nothink-promptsauthors-T0-p1-n512-s0",
    "sd+topk_delta-k4-top10-dl0.3-draftint8-b2-afterstep-T0-p1-n64-s0",
    "sd_tree-d4-w4-t16-think-T1-p1-n8-s0",
    "mars-k4-th0.9-pmin0.3-nothink-T0-p1-n32-s1",
])
def test_protocol_tag_parts_round_trip(name):
    t = RunSpec.parse(name)
    assert t is not None and t.label == name
    b = t.baseline()
    assert (b.system_prompt, b.budget, b.enable_thinking, b.task_prompts) == (
        t.system_prompt, t.budget, t.enable_thinking, t.task_prompts)
    assert RunSpec.parse(b.label) == b


@pytest.mark.parametrize("old", ["mars-k4-th0.9-T0-p1-n32-s0", "ar-b4-T0-p1-n24-s0", "sd-k4-draftint8-b2-T0-p1-n8-s0"])
def test_old_run_names_parse_unchanged(old):
    t = RunSpec.parse(old)
    assert t.label == old
    assert (t.system_prompt, t.budget, t.enable_thinking, t.task_prompts) == ("none", "exact", None, "ours")


def test_each_protocol_setting_changes_the_tag(tmp_path):
    def tag(*o):
        return spec_of(tiny_cfg(tmp_path, "method=mars", *o), 64).label

    base = tag()
    assert base == "mars-k4-th0.9-T0-p1-n64-s0"
    changed = [tag("protocol.system_prompt=llama2"), tag("protocol.budget=after_step"),
               tag("model.enable_thinking=false"), tag("model.enable_thinking=true"), tag("protocol=authors")]
    assert len({base, *changed}) == 1 + len(changed)
    assert spec_of(tiny_cfg(tmp_path, "method=mars"), 64, task_prompts="authors").label == (
        "mars-k4-th0.9-promptsauthors-T0-p1-n64-s0")


# ---- bad input -----------------------------------------------------------------------------------------
def test_unknown_protocol_is_one_line():
    with pytest.raises(ConfigError, match=r"^protocol='theirs'; allowed: authors, ours$"):
        check_overrides(["protocol=theirs"])


@pytest.mark.parametrize("override,needle", [
    ("protocol.system_prompt=llama3", "protocol.system_prompt='llama3'; allowed: none, llama2"),
    ("protocol.budget=soft", "protocol.budget='soft'; allowed: exact, after_step"),
    ("protocol.task_prompts=theirs", "protocol.task_prompts='theirs'; allowed: ours, authors"),
    ("protocol.max_new_tokens=0", "protocol.max_new_tokens=0; allowed: an integer in [1, 1048576] or null"),
])
def test_bad_protocol_values_one_line(tmp_path, override, needle):
    with pytest.raises(ConfigError) as e:
        R.prepare(tiny_cfg(tmp_path / "r", override))
    assert str(e.value) == needle
    assert not (tmp_path / "r").exists()


def test_registry_names_fit_in_a_run_tag():
    import re

    assert all(re.fullmatch(r"[a-z0-9_]+", n) for n in SYSTEM_PROMPTS) and SYSTEM_PROMPTS["none"] is None
