"""MT-Bench (80 two-turn questions): speed per turn is the runner's; quality is an optional LLM judge."""
from __future__ import annotations

from mars_bench.tasks import data as D
from mars_bench.tasks.base import Sample, Task, mean
from mars_bench.tasks.judge import NEED_REF_CATEGORIES, PROMPT_VERSION, JudgeClient, load_judge_prompts

CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")


class MTBench(Task):
    name = "mt_bench"
    Q_FIELDS = {"question_id": "int", "category": "str", "turns": "list"}
    R_FIELDS = {"question_id": "int", "choices": "list"}

    def __init__(self, **overrides):
        super().__init__(**overrides)
        self._judge_prompts: dict | None = None
        self._data_dir = None

    def load(self, data_dir=None, limit=None, subset=None) -> list[Sample]:
        samples = super().load(data_dir, limit, subset)
        self._data_dir = data_dir
        if self.judge_enabled():
            self.judge_prompts()          # a missing or malformed prompt file stops the run before generation
        return samples

    def judge_prompts(self) -> dict:
        """FastChat's judge prompts (``mars_release/judge_prompts.jsonl``), read once."""
        if self._judge_prompts is None:
            self._judge_prompts = load_judge_prompts(self._data_dir, self.download)
        return self._judge_prompts

    def read_rows(self, data_dir) -> list[dict]:
        q_rel, r_rel = self.data["files"]
        questions = self.jsonl_rows(data_dir, q_rel, self.Q_FIELDS, self.rows_expected(q_rel))
        refs = self.jsonl_rows(data_dir, r_rel, self.R_FIELDS, self.rows_expected(r_rel))
        q_shown, r_shown = self.display_path(data_dir, q_rel), self.display_path(data_dir, r_rel)
        ref_by_id = {}
        for i, r in enumerate(refs, 1):
            ch = r["choices"]
            turns = ch[0].get("turns") if ch and isinstance(ch[0], dict) else None
            if not (isinstance(turns, list) and len(turns) == 2 and all(isinstance(t, str) for t in turns)):
                raise D.DataError(r_shown, "expected field 'choices' to be [{'turns': [2 strings]}, ...]", i)
            ref_by_id[r["question_id"]] = turns
        seen = set()
        for i, q in enumerate(questions, 1):
            t = q["turns"]
            if not (len(t) == 2 and all(isinstance(x, str) and x for x in t)):
                raise D.DataError(q_shown, "expected field 'turns' to be a list of 2 non-empty strings", i)
            if q["question_id"] in seen:
                raise D.DataError(q_shown, f"expected unique question_id, {q['question_id']} repeats", i)
            seen.add(q["question_id"])
            if q["category"] in NEED_REF_CATEGORIES and q["question_id"] not in ref_by_id:
                raise D.DataError(r_shown, f"expected a reference answer for question_id {q['question_id']} "
                                           f"({q['category']})")
            q["_ref"] = ref_by_id.get(q["question_id"])
        return questions

    def make_sample(self, index: int, row: dict) -> Sample:
        cat = row["category"]
        return Sample(id=str(row["question_id"]), turns=[self.format_prompt(prompt=t) for t in row["turns"]],
                      reference={"category": cat, "ref_answers": row["_ref"] if cat in NEED_REF_CATEGORIES
                                 else None},
                      meta={"index": index, "question_id": row["question_id"], "category": cat,
                            "questions": list(row["turns"])})

    def judge_enabled(self) -> bool:
        return bool(self.options.get("judge"))

    def client(self) -> JudgeClient:
        o = self.options
        return JudgeClient(o.get("judge_url"), o.get("judge_model"), o.get("judge_api_key_env"),
                           timeout_s=o.get("judge_timeout_s", 120), max_tokens=o.get("judge_max_tokens", 2048),
                           temperature=o.get("judge_temperature", 0.0), retries=o.get("judge_retries", 3),
                           backoff_s=o.get("judge_backoff_s", 2.0))

    def score(self, sample: Sample, outputs: list[str]) -> dict:
        """{} when the judge is off (default); else the judge's 1-10 score per turn (None when it failed) and
        ``judge_score``, the mean of the turns' available scores (None when none)."""
        if not self.judge_enabled():
            return {}
        client = self.client()
        cat = sample.reference["category"]
        questions = sample.meta.get("questions") or sample.turns
        out = {"category": cat, "judge_model": client.model}
        for turn in range(1, min(2, len(outputs)) + 1):
            g = client.grade(questions, outputs, turn, cat, sample.reference["ref_answers"], self.judge_prompts())
            out[f"judge_score_turn{turn}"] = g["score"]
            out[f"judgment_turn{turn}"] = g["judgment"]
            out[f"judge_prompt_turn{turn}"] = g["prompt"]
            out[f"judge_error_turn{turn}"] = g["error"]
        out["judge_score"] = mean(out[k] for k in ("judge_score_turn1", "judge_score_turn2")
                                  if out.get(k) is not None)
        return out

    def aggregate(self, samples, scored, outputs) -> dict:
        """FastChat's view: mean score of turn 1, of turn 2, and over all graded turns (also per category)."""
        if not any("judge_score_turn1" in s for s in scored):
            return {}
        per_turn = {t: [s.get(f"judge_score_turn{t}") for s in scored if f"judge_score_turn{t}" in s]
                    for t in (1, 2)}
        valid = {t: [x for x in v if x is not None] for t, v in per_turn.items()}
        out = {"judge_score": mean(valid[1] + valid[2]),
               "judge_score_turn1": mean(valid[1]), "judge_score_turn2": mean(valid[2])}
        for cat in CATEGORIES:
            xs = [s.get(f"judge_score_turn{t}") for s in scored if s.get("category") == cat for t in (1, 2)]
            xs = [x for x in xs if x is not None]
            if xs:
                out[f"judge_score_{cat}"] = mean(xs)
        out["n_judged"] = len(valid[1]) + len(valid[2])
        out["n_judge_failed"] = sum(len(v) for v in per_turn.values()) - out["n_judged"]
        models = sorted({s["judge_model"] for s in scored if s.get("judge_model")})
        out["judge_model"] = ",".join(models)
        out["judge_prompts"] = PROMPT_VERSION
        return out

