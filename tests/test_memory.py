"""check_memory on every device a batch uses (a sharded target: layers on several GPUs, logits on the last),
with the cache's growth slack and the prefill copy; offload by a device_map refused unless asked for."""
from types import SimpleNamespace

import pytest
import torch

from mars_bench.decode.backend import check_memory
from mars_bench.base.errors import ConfigError
from mars_bench.models.pairs import check_offload

CPU, META = torch.device("cpu"), torch.device("meta")


def sharded(per_token: dict, vocab: int = 1000, logits_on=META, slack: int = 40):
    return SimpleNamespace(kv_bytes_by_device=lambda: per_token, out_vocab=vocab, logits_device=logits_on,
                           cached_columns=lambda tokens: tokens + slack)


def test_each_device_is_checked_against_its_own_free_memory():
    m = sharded({CPU: 100, META: 300})
    cols = m.cached_columns(50)
    logits = 2 * 5 * 1000 * 4
    need = {CPU: 100 * cols * 5, META: 300 * cols * 5 + logits * 4}     # 4 rows + the prefill copy
    check_memory([m], 4, 50, 5, available={CPU: int(need[CPU] / 0.9) + 9, META: int(need[META] / 0.9) + 9})
    with pytest.raises(ValueError, match=r"batch_size=4 needs .* on meta .*largest batch that fits is batch_size=3$"):
        check_memory([m], 4, 50, 5, available={CPU: 10 ** 12, META: int(need[META] / 0.9) - 9})
    with pytest.raises(ValueError, match=r" on cpu "):
        check_memory([m], 4, 50, 5, available={CPU: int(need[CPU] / 0.9) - 9, META: 10 ** 12})


def test_adapter_reports_kv_bytes_per_device_of_its_layers(tiny):
    target = tiny[0]
    assert target.kv_bytes_by_device() == {CPU: target.kv_bytes_per_token()}
    assert target.logits_device == CPU


def test_growth_slack_exceeds_the_committed_tokens(tiny):
    target = tiny[0]
    assert target.cached_columns(1000) >= 1.5 * 1000 and target.cached_columns(10) >= 10 + 32


def test_offload_is_refused_in_one_line_unless_allowed():
    model = SimpleNamespace(hf_device_map={"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu",
                                           "lm_head": "disk"})
    with pytest.raises(ConfigError, match=r"^model.device_map offloaded 2 modules .*model.allow_offload=true") as e:
        check_offload(model, False)
    assert "\n" not in str(e.value)
    check_offload(model, True)
    check_offload(SimpleNamespace(hf_device_map={"": 0}), False)
    check_offload(SimpleNamespace(), False)


def test_a_fast_path_bf16_target_is_checked_at_batch_size_1():
    """The embedded default (bf16 panels: the LM head holds no ``weight``) passes the memory check the runner makes
    before every batch, B = 1 included (make run failed there once)."""
    from mars_bench.models import fastpath
    from mars_bench.models.adapter import CausalLMAdapter
    from mars_bench.models.tiny import tiny_pair

    target, draft, _ = tiny_pair(dtype=torch.bfloat16)
    adapters = [CausalLMAdapter(fastpath.enable_fast_path(m)) for m in (target, draft)]
    assert adapters[0].logits_device == torch.device("cpu")
    check_memory(adapters, 1, 64, 5)
    with pytest.raises(ValueError, match="batch_size=1 needs"):
        check_memory(adapters, 1, 64, 5, available=1)
