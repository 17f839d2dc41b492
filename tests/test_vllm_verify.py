"""The rule registry inside vLLM's verification (mars_bench/engines/vllm/verify.py), on CPU tensors, without vLLM.

vLLM's chain kernel is emulated here (``kernel``: its greedy and random paths as vllm/v1/sample/rejection_sampler.py
0.32 writes them, including the residual draw of the recovered token). The plugin's path = ``decide`` + ``rewrite`` +
that kernel must equal the native rule (rules/mars.py through ``verify_chain``):
1. greedy, random logits and drafts near the top: per request the same accepted prefix and the same next token;
2. sampled: per position the rule's decision with the same uniforms; the audit's relaxed entries are exactly the
   positions the standard test rejects and a clause accepts;
3. sampled, Monte Carlo: the acceptance probability split into standard / top2_margin / top1 and the law of the
   first committed token equal the analytic ones of tests/test_mars_sampled.py's toy position;
4. exact leaves the kernel's input untouched; rules vLLM cannot express are refused in one line.
"""
import pytest
import torch
from scipy.stats import binomtest, chisquare

from mars_bench.config.spec import spec_of
from mars_bench.base.errors import ConfigError
from mars_bench.decode import rules, sampling
from mars_bench.engines.vllm import verify

from .test_mars_sampled import P, Q, Z, analytic, committed_law

V = 50


def kernel(draft, num_draft, logits, draft_probs, uniform, greedy, bonus, gen):
    """vLLM 0.32's rejection_sample on CPU tensors: per request the emitted tokens (accepted drafts + recovered or
    bonus). Random path: accept iff q > 0 and p / q >= u (q = 1 without draft probs); recovered from
    norm(max(0, p - q)) (without draft probs: p with the draft zeroed)."""
    out, start = [], 0
    probs = torch.softmax(logits.float(), -1)
    for b, n in enumerate(num_draft):
        toks = []
        for i in range(start, start + n):
            d = int(draft[i])
            if greedy[b]:
                t = int(logits[i].argmax())
                toks.append(t)
                if t != d:
                    break
                continue
            q = 1.0 if draft_probs is None else float(draft_probs[i, d])
            if q > 0 and float(probs[i, d]) / q >= float(uniform[i]):
                toks.append(d)
                continue
            if draft_probs is None:
                res = probs[i].clone()
                res[d] = 0
            else:
                res = (probs[i] - draft_probs[i]).clamp_min(0)
            toks.append(int(torch.multinomial(res / res.sum(), 1, generator=gen)))
            break
        else:
            toks.append(int(bonus[b]))
        out.append(toks)
        start += n
    return out


def random_step(gen, num_draft, near_top=True):
    """Raw logits with some z1 < 0 rows, drafts drawn among the top-3 (and elsewhere)."""
    n = sum(num_draft)
    z = torch.randn(n, V, generator=gen) * 2 + torch.rand(n, 1, generator=gen) * 6 - 1
    order = z.argsort(-1, descending=True)
    pick = torch.randint(0, 3 if near_top else V, (n,), generator=gen)
    draft = order.gather(-1, pick[:, None]).squeeze(-1)
    return z, draft


@pytest.mark.parametrize("theta", [0.5, 0.8, 0.9, 1.0])
@pytest.mark.parametrize("nonpositive_top1", ["strict", "ratio"])
def test_greedy_chain_equals_the_native_rule(theta, nonpositive_top1):
    gen = torch.Generator().manual_seed(int(theta * 100) + len(nonpositive_top1))
    settings = rules.mars.settings({"theta": theta, "nonpositive_top1": nonpositive_top1})
    relaxed_seen = 0
    for _ in range(40):
        num_draft = [int(x) for x in torch.randint(0, 6, (4,), generator=gen)]
        z, draft = random_step(gen, num_draft)
        bonus = torch.randint(0, V, (4,), generator=gen)
        dec = verify.decide(draft, num_draft, z, z.clone(), None, None, [True] * 4, [(rules.mars, settings)] * 4)
        logits = verify.rewrite(z.clone(), draft, dec.relaxed)
        got = kernel(draft, num_draft, logits, None, None, [True] * 4, bonus, gen)
        start = 0
        for b, n in enumerate(num_draft):
            if n == 0:                                         # no drafts: the bonus token alone
                assert got[b] == [int(bonus[b])]
                continue
            rows = torch.cat([z[start:start + n], z[start:start + 1]])   # a k + 1-th row for the next token
            cv = rules.verify_chain(rules.mars, draft[start:start + n], rows, None, 0.0, 1.0, None, **settings)
            want = draft[start:start + cv.n_accepted].tolist()
            want.append(int(bonus[b]) if cv.n_accepted == n else cv.next_token)
            assert got[b] == want, (b, got[b], want)
            relaxed_seen += sum(c is not None for c in cv.clause)
            start += n
        out = torch.full((4, 6), verify.PLACEHOLDER)
        for b, toks in enumerate(got):
            out[b, :len(toks)] = torch.tensor(toks)
        records = verify.audit(dec, draft, num_draft, verify.accepted_counts(out))
        assert all(r["agree"] for r in records)
        assert [len(r["relaxed"]) for r in records] == \
            [int(dec.relaxed[s:s + r["accepted"]].sum()) for s, r in zip([0, *torch.tensor(num_draft).cumsum(0)[:-1].tolist()], records)]
    assert (relaxed_seen == 0) == (theta == 1.0)


@pytest.mark.parametrize("sampled_top1", ["always", "margin"])
@pytest.mark.parametrize("with_q", [True, False])
def test_sampled_decision_equals_the_native_rule_with_the_same_uniforms(sampled_top1, with_q):
    gen = torch.Generator().manual_seed(7 + with_q)
    settings = rules.mars.settings({"theta": 0.8, "sampled_top1": sampled_top1})
    for _ in range(30):
        num_draft = [3, 0, 5, 2]
        z, draft = random_step(gen, num_draft)
        logits = z / 0.7                                       # what vLLM's kernel reads: temperature 0.7
        q = torch.softmax(torch.randn(len(draft), V, generator=gen), -1) if with_q else None
        u = torch.rand(len(draft), generator=gen, dtype=torch.float64)
        dec = verify.decide(draft, num_draft, z, logits, q, u, [False] * 4, [(rules.mars, settings)] * 4)
        p = torch.softmax(logits, -1)
        qq = q if with_q else torch.nn.functional.one_hot(draft, V).float()
        v = rules.mars(draft, z, p, qq, u, **settings)
        assert torch.equal(dec.accept, v.accept) and torch.equal(dec.relaxed, v.relaxed)
        assert torch.equal(dec.clause, v.clause)
        rewritten = verify.rewrite(logits.clone(), draft, dec.relaxed)
        changed = (rewritten != logits).any(-1)
        assert torch.equal(changed, dec.relaxed)               # only relaxed rows are rewritten
        pr = torch.softmax(rewritten, -1)
        rows = dec.relaxed.nonzero().squeeze(-1)
        assert torch.all(pr[rows, draft[rows]] == 1.0)          # the kernel accepts them whatever u is


def test_mixed_batch_touches_only_the_harness_requests():
    gen = torch.Generator().manual_seed(3)
    num_draft = [4, 4, 4]
    z, draft = random_step(gen, num_draft)
    draft[:] = z.argsort(-1, descending=True)[:, 1]           # every draft is the top-2
    spec = (rules.mars, rules.mars.settings({"theta": 0.0 + 1e-9, "nonpositive_top1": "ratio"}))
    dec = verify.decide(draft, num_draft, z, z.clone(), None, None, [True] * 3, [spec, None, (rules.exact, {})])
    assert dec.relaxed[:4].all() and not dec.relaxed[4:].any()
    assert dec.rules == ["mars", None, "exact"]
    draft[0] = -1                                              # vLLM's padding: rejected, never relaxed
    assert not verify.decide(draft, num_draft, z, z.clone(), None, None, [True] * 3, [spec] * 3).relaxed[0]


def test_exact_leaves_the_kernel_input_untouched():
    gen = torch.Generator().manual_seed(11)
    z, draft = random_step(gen, [5, 5])
    u = torch.rand(10, generator=gen, dtype=torch.float64)
    for greedy in (True, False):
        dec = verify.decide(draft, [5, 5], z, z.clone(), None, u, [greedy] * 2, [(rules.exact, {})] * 2)
        assert not dec.relaxed.any()
        logits = z.clone()
        assert torch.equal(verify.rewrite(logits, draft, dec.relaxed), z)


def test_rules_vllm_cannot_express_are_refused_in_one_line():
    assert {"exact", "mars", "mars_prob"} <= set(verify.supported_rules())
    for name in ("fly", "typical"):
        with pytest.raises(ValueError, match=f"rule={name} cannot run inside vLLM.*allowed with engine=vllm: exact"):
            verify.check_rule(name, {})
    with pytest.raises(ValueError, match="outside_top2=skip.*allowed with engine=vllm: test"):
        verify.check_rule("mars", {"outside_top2": "skip"})
    verify.check_rule("mars", rules.mars.settings({}))


# ---------------------------------------------------------------- the sampled rule's law, Monte Carlo

N_MC = 20000


@pytest.mark.parametrize("theta,sampled_top1", [(0.8, "always"), (0.8, "margin"), (0.95, "always"), (0.95, "margin")])
def test_sampled_acceptance_and_first_token_law_match_the_analytic_ones(theta, sampled_top1):
    """The toy position of test_mars_sampled (V = 4, r = 0.886): drafts drawn from Q, vLLM's kernel emulated."""
    gen = torch.Generator().manual_seed(2026)
    settings = rules.mars.settings({"theta": theta, "sampled_top1": sampled_top1})
    logits = torch.log(P)[None]                                # p_target = P at T = 1
    d = sampling.sample(Q.expand(N_MC, 4), gen)               # N_MC requests of one draft each, one step
    u = torch.rand(N_MC, generator=gen, dtype=torch.float64)
    ones, z, lg, q = [1] * N_MC, Z.expand(N_MC, 4), logits.expand(N_MC, 4), Q.expand(N_MC, 4)
    dec = verify.decide(d, ones, z, lg, q, u, [False] * N_MC, [(rules.mars, settings)] * N_MC)
    toks = kernel(d, ones, verify.rewrite(lg.clone(), d, dec.relaxed), q, u, [False] * N_MC, [-1] * N_MC, gen)
    records = verify.audit(dec, d, ones, [len(t) - 1 for t in toks])
    counts = {"standard": 0, "top2_margin": 0, "top1": 0, "rejected": 0}
    first = [0] * 4
    for t, rec in zip(toks, records):
        key = "rejected" if len(t) == 1 else (rec["relaxed"][0]["clause"] if rec["relaxed"] else "standard")
        counts[key] += 1
        first[t[0]] += 1
    std, top2, top1 = analytic(theta, sampled_top1)
    for key, prob in (("standard", std), ("top2_margin", top2), ("top1", top1), ("rejected", 1 - std - top2 - top1)):
        if prob == 0:
            assert counts[key] == 0, key
        else:
            assert binomtest(counts[key], N_MC, prob).pvalue > 1e-3, (key, counts[key] / N_MC, prob)
    law = committed_law(theta, sampled_top1)
    assert chisquare(first, (law / law.sum() * N_MC).tolist()).pvalue > 1e-3, (first, law)


# ---------------------------------------------------------------- engine=vllm: bad input in one line, before any model

def _cfg(*overrides):
    from hydra import compose, initialize_config_dir

    from mars_bench.config import schema as C

    from .conftest import ROOT

    C.register()
    with initialize_config_dir(config_dir=str(ROOT / "mars_bench" / "conf"), version_base="1.3"):
        return compose(config_name="config", overrides=["model=tiny", "engine=vllm", *overrides])


def _validate(cfg):
    """What the runner checks before a job: the schema (validation.validate), then the engine (engines.validate)."""
    from mars_bench import engines
    from mars_bench.config.validation import validate

    engines.validate(cfg, validate(cfg))


def test_engine_vllm_without_vllm_names_the_install_command(monkeypatch):
    from mars_bench.engines.vllm import compat as vllm_compat

    monkeypatch.setattr(vllm_compat, "installed_version", lambda: None)
    with pytest.raises(ConfigError, match=r"^engine=vllm needs vLLM.*install it with: .*\.ci/vllm\.sh") as e:
        _validate(_cfg("method=sd"))
    assert "\n" not in str(e.value)
    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.31.1")
    with pytest.raises(ConfigError, match=r"^vLLM 0\.31\.1 is installed; engine=vllm accepts vLLM 0\.32\.\*, 0\.33\.\*, 0\.34\.\* only"):
        _validate(_cfg("method=sd"))


@pytest.mark.parametrize("overrides,needle", [
    (["method=sd_tree"], r"method=sd_tree \(draft trees\) cannot run on engine=vllm; allowed: ar, sd, mars"),
    (["method=mars_tree"], r"method=mars_tree \(draft trees\) cannot run on engine=vllm"),
    (["method=sd", "rule=fly"], r"rule=fly cannot run inside vLLM's verification.*allowed with engine=vllm: exact"),
    (["method=sd", "rule=typical", "temperature=1"], r"rule=typical cannot run inside vLLM"),
    (["method=sd", "rule=topk_delta", "temperature=1"], r"rule=topk_delta is not defined for sampled decoding"),
    (["method=mars", "temperature=1", "+rule.outside_top2=skip"], r"rule.outside_top2=skip cannot run"),
    (["method=sd", "method.p_min=0.3"], r"method.p_min=0.3 .*allowed: 0"),
    (["method=sd", "protocol=authors"], r"protocol.budget=after_step cannot run on engine=vllm; allowed: exact"),
    (["method=sd", "engine.tensor_parallel_size=0"], r"engine.tensor_parallel_size=0; allowed: an integer >= 1"),
    (["method=sd", "engine.distributed_executor_backend=slurm"],
     r"engine.distributed_executor_backend='slurm'; allowed: null, mp, ray"),
    (["method=sd", "engine.gpu_memory_utilization=1.5"], r"engine.gpu_memory_utilization=1.5; allowed: a number in"),
])
def test_engine_vllm_refuses_what_vllm_cannot_run(monkeypatch, overrides, needle):
    from mars_bench.engines.vllm import compat as vllm_compat

    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0+cpu")
    with pytest.raises(ConfigError, match=needle) as e:
        _validate(_cfg(*overrides))
    assert "\n" not in str(e.value)


def test_engine_vllm_refuses_more_ranks_than_gpus_on_one_node_with_mp(monkeypatch):
    """With the backend set explicitly vLLM skips its own count of the visible GPUs: mp (one node) is checked here."""
    import torch

    from mars_bench.engines.vllm import compat as vllm_compat

    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    base = ["method=sd", "model.device=cuda", "engine.tensor_parallel_size=2", "engine.pipeline_parallel_size=2"]
    with pytest.raises(ConfigError, match=r"= 4; allowed with engine.distributed_executor_backend=mp \(one node\): at "
                       r"most the 2 visible GPUs") as e:
        _validate(_cfg(*base, "engine.distributed_executor_backend=mp"))
    assert "\n" not in str(e.value)
    for backend in ("ray", "null"):    # ray spans nodes; null: vLLM counts the GPUs itself
        _validate(_cfg(*base, f"engine.distributed_executor_backend={backend}"))


def test_engine_vllm_accepts_chains_and_records_the_version(monkeypatch):
    from mars_bench.engines.vllm import compat as vllm_compat
    from mars_bench.store.spec import RunSpec

    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0+cpu")
    for method in ("ar", "sd", "mars", "lookup"):
        cfg = _cfg(f"method={method}")
        _validate(cfg)
        spec = spec_of(cfg, 32)
        assert (spec.engine, spec.engine_version) == ("vllm", "0.32.0+cpu")
        native = _cfg(f"method={method}", "engine=native")
        _validate(native)
        assert spec_of(native, 32).dir_name != spec.dir_name   # never one directory


def test_vllms_own_refusal_comes_back_in_one_line(monkeypatch, tmp_path):
    """vLLM's ValueError when the LLM is built (here: its message for a tensor-parallel size larger than the visible
    GPUs, raised by a stand-in ``vllm.LLM``) is one ConfigError line, vLLM's error chained."""
    import sys
    import types

    from mars_bench.engines.vllm import engine as vllm, compat as vllm_compat

    message = ("World size (4) is larger than the number of available GPUs (1) in this node. If this is "
               "intentional and you are using:\n- ray, set '--distributed-executor-backend ray'.\n- multiprocessing, "
               "set '--nnodes' appropriately.")

    def refuse(**kwargs):
        assert kwargs["tensor_parallel_size"] == 4
        raise ValueError(message)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=refuse))
    for key in [*vllm_compat.ENV, *vllm_compat.CPU_ENV, "MARS_BENCH_VLLM_PLUGIN", "MARS_BENCH_VLLM_AUDIT"]:
        monkeypatch.setenv(key, "")      # restored after the test: build_llm sets them for vLLM
    cfg = _cfg("method=ar", "engine.tensor_parallel_size=4", "engine.max_model_len=64", "model.device=cpu")
    with pytest.raises(ConfigError, match=r"^vLLM refused the engine settings: World size \(4\) is larger") as e:
        vllm.build_llm(cfg, str(tmp_path), None, str(tmp_path), vllm.MemoryShare.of(cfg.engine, 1))
    assert "\n" not in str(e.value) and isinstance(e.value.__cause__, ValueError)


def test_the_plugin_is_vllms_entry_point_and_idle_unless_asked(monkeypatch):
    """vLLM loads ``vllm.general_plugins`` in every process: ours is registered there and patches nothing unless
    the harness set MARS_BENCH_VLLM_PLUGIN=1 (an installed mars-bench leaves a user's other vLLM runs alone)."""
    from importlib.metadata import entry_points

    from mars_bench.engines.vllm import compat as vllm_compat, plugin as vllm_plugin

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "mars_bench"]
    assert ep.load() is vllm_plugin.register
    installed = []
    monkeypatch.setattr(vllm_compat, "check_version", lambda: "0.32.0")
    monkeypatch.setattr(vllm_compat, "install", installed.append)
    for value in (None, "0", ""):
        if value is None:
            monkeypatch.delenv(vllm_plugin.ACTIVE, raising=False)
        else:
            monkeypatch.setenv(vllm_plugin.ACTIVE, value)
        vllm_plugin.register()
    assert installed == []
    monkeypatch.setenv(vllm_plugin.ACTIVE, "1")
    vllm_plugin.register()
    assert installed == [vllm_plugin.step]


def test_the_plugins_switch_and_audit_folder_reach_ray_workers(monkeypatch, tmp_path):
    """vLLM's Ray executor copies only its own prefixes and the names in VLLM_RAY_EXTRA_ENV_VARS_TO_COPY to its
    workers: the LLM is built with the plugin's two variables listed there, after the user's own names."""
    import os
    import sys
    import types

    from mars_bench.engines.vllm import engine as vllm, compat as vllm_compat

    seen = {}

    def build(**kwargs):
        seen.update(os.environ)
        return "llm"

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=build))
    for key in [*vllm_compat.ENV, *vllm_compat.CPU_ENV, "MARS_BENCH_VLLM_PLUGIN", "MARS_BENCH_VLLM_AUDIT"]:
        monkeypatch.setenv(key, "")
    monkeypatch.setenv(vllm_compat.RAY_EXTRA_ENV, "MY_VAR")
    cfg = _cfg("method=ar", "engine.max_model_len=64", "model.device=cpu")
    for _ in range(2):     # a second LLM in the process lists each name once
        assert vllm.build_llm(cfg, str(tmp_path), None, str(tmp_path / "audit"),
                              vllm.MemoryShare.of(cfg.engine, 1)) == "llm"
        names = seen[vllm_compat.RAY_EXTRA_ENV].split(",")
        assert names[0] == "MY_VAR" and len(names) == len(set(names))
        assert {"MARS_BENCH_VLLM_PLUGIN", "MARS_BENCH_VLLM_AUDIT"} <= set(names)
        assert seen["MARS_BENCH_VLLM_AUDIT"] == str(tmp_path / "audit")


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_llms_a_run_holds_share_the_configured_memory(monkeypatch, tmp_path, device):
    """A run holds one LLM per drafting setup of its methods (ar; sd and mars share one): Models counts them and each
    LLM asks for an equal share, so that together they never exceed engine.gpu_memory_utilization (GPUs) or
    engine.kv_cache_gib (CPU: kv_cache_memory_bytes, with vLLM's legacy VLLM_CPU_KVCACHE_SPACE unset, which would
    override it). Stand-in ``vllm.LLM``: the kwargs handed to it, no model loaded."""
    import os
    import sys
    import types

    from mars_bench.config.settings import method_of
    from mars_bench.engines.vllm import engine as vllm, compat as vllm_compat

    built = []

    def build(**kwargs):
        built.append({**kwargs, "env_kv": os.environ.get(vllm_compat.CPU_KV_ENV)})
        return f"llm{len(built)}"

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=build))
    monkeypatch.setattr(vllm_compat, "installed_version", lambda: "0.32.0+cpu")
    monkeypatch.setattr(vllm, "_cuda", lambda: device == "cuda")
    monkeypatch.setenv("MARS_BENCH_CACHE", str(tmp_path / "cache"))
    for key in [*vllm_compat.ENV, *vllm_compat.CPU_ENV, "MARS_BENCH_VLLM_PLUGIN", "MARS_BENCH_VLLM_AUDIT"]:
        monkeypatch.setenv(key, "")
    monkeypatch.setenv(vllm_compat.CPU_KV_ENV, "4")      # a user's legacy setting: never over the share
    settings = ("engine.gpu_memory_utilization=0.8", "engine.kv_cache_gib=1.5", "engine.max_model_len=64",
                "model.device=auto")
    methods = {m: method_of(_cfg(f"method={m}", *settings)) for m in ("ar", "sd", "mars")}
    models = vllm.Models(_cfg("method=sd", *settings), list(methods.values()))
    assert models.share.held == 2
    assert [models.llm(methods[m]) for m in ("ar", "sd", "mars", "ar")] == ["llm1", "llm2", "llm2", "llm1"]
    assert [b["speculative_config"] is None for b in built] == [True, False]
    if device == "cuda":
        assert [b["gpu_memory_utilization"] for b in built] == [pytest.approx(0.4)] * 2
        assert all("kv_cache_memory_bytes" not in b for b in built)
    else:
        assert [b["kv_cache_memory_bytes"] for b in built] == [int(0.75 * 2 ** 30)] * 2
        assert all("gpu_memory_utilization" not in b for b in built) and [b["env_kv"] for b in built] == [None] * 2
    alone = vllm.Models(_cfg("method=sd", *settings), [methods["sd"], methods["mars"]])
    assert alone.share.held == 1 and alone.share.gpu_memory_utilization == pytest.approx(0.8)
    assert alone.share.kv_cache_gib == pytest.approx(1.5)
    with pytest.raises(RuntimeError, match="method ar needs an LLM"):   # a method whose share was not counted
        alone.llm(methods["ar"])
