"""Dev-split study of decode-time changes to the conditioned global adapter (RESULTS 0s, 0t, 0v, 0w, 0ze).

Each variant but `beam` and `pbeam` decodes greedily on the device's prompt (the bundle's format: the user's
recent and closest headlines, `prompting.prompt_tokens`) with the global adapter, like the bench's
`global-history`, and changes only how the next token is picked among the adapter's top k (20) candidates (or,
for `oracle`, which example the prompt shows); `beam` and `pbeam` search instead of picking greedily:

- `contrast=A`: log p_cond + A * (log p_cond - log p_plain), with p_plain the same adapter on the plain prompt
  (no history), evaluated in a second llama.cpp context. Amplifies what the history adds (context-aware
  decoding); A = 0 is the adapter alone.
- `minlen-user=F` / `minlen-all=F`: end-of-output tokens are banned until the output has F times the median
  token length of the user's history headlines (`minlen-user`) or of all users' (`minlen-all`, the
  non-personal control).
- `copy=B`: +B nats for the first token of every article word that is not a stop word, in any of its casings
  (headlines copy some of the article's words, and copied words hit the author's headline twice as often).
- `views=W`: (1 - W) log p_cond + W log p_closest, with p_closest the same adapter on a second view of the same
  user's history (the 5 BM25-closest headlines, none of the recent ones), in a second context: an ensemble of
  two history prompts. W = 0 is the adapter alone.
- `hcopy=B`: +B nats for the first token of every word of the prompt's example headlines (the user's recent and
  closest ones) that is not a stop word and not in the article: `copy` for the history's words.
- `wrepeat=B`: -B nats for a word token the output already holds (a token of 3 or more letters, not a stop word,
  the same word in any casing, with or without its leading space): a repetition penalty on words only, where
  llama.cpp's presence penalty also hits digits and quotes.
- `oracle=N` (a ceiling, chosen with the answer): plain greedy decoding, but the prompt's closest example is the
  earlier headline (not one of the recent ones) with the highest ROUGE-1 against the author's real headline,
  among the N BM25-closest (N = 0: the whole history). It bounds what a better retriever could give.
- `recent=N`: plain greedy decoding, but N of the prompt's examples are the user's most recent headlines and the
  rest the BM25-closest (the device shows 4 and 1; `recent=0` is the 5 closest, `recent=5` the 5 most recent).
  With a per-user choice among them (`scripts/prompt_choice.py`) it measures whether users differ in which
  examples serve them.
- `beam=B`: beam search with B beams over the adapter's top k, in B batched llama.cpp sequences, kept by the sum
  of log-probabilities; of the finished outputs it writes the best by that sum (`beam=B`) and by the sum
  divided by the token count (`beam=B`+`-mean`) and by its square root (`beam=B`+`-sqrt`). `beam=1` is greedy.
  `pbeam=B` is the same on the plain prompt (no history): the global adapter's beam search, the control.

It writes `OUT/cache/<variant>/<user>.json` as `localpers bench` does (query ids, texts, ROUGE-1), so
`scripts/compare_runs.py RUN:global-history OUT:<variant>` compares it with a bench run of the same queries.
It resumes: a user whose file exists is skipped. Timings it records are not a cost measurement (contrast and
views use two contexts where the product would batch). Nothing here is used by the product.

    python scripts/decode_variants.py --bundle ../bundle-a --out ../bench-runs/dev24-decode \
        --variants contrast=0.25 contrast=0.5 contrast=1 minlen-user=0.8 minlen-user=1 minlen-all=0.8 \
        minlen-all=1 copy=0.5 copy=1 copy=2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import log_softmax
from train_oracle_prompts import FirstThenBm25

from localpers.atomic import atomic_write_text
from localpers.bench.data import BenchQuery, BenchUser, load_bench_users
from localpers.bench.metrics import rouge
from localpers.engine import Engine
from localpers.engine.repeated_words import STOP_WORDS, RepeatedWordRule
from localpers.methods.card import prompting
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task
from localpers.users.history_index import HistoryIndex

TOP_K = 20


WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’-]*")

# The variants that score each step in a second context too: on the plain prompt, or on a second history view.
SECOND_CONTEXT = ("contrast", "views")


@dataclass(frozen=True)
class Variant:
    """One decode-time change: `kind` is one of the module docstring's variants, with its number."""

    name: str
    kind: str
    value: float

    @classmethod
    def parse(cls, spec: str) -> Variant:
        kind, _, number = spec.partition("=")
        if kind not in SECOND_CONTEXT + (
            "minlen-user",
            "minlen-all",
            "copy",
            "hcopy",
            "oracle",
            "beam",
            "pbeam",
            "recent",
            "wrepeat",
        ):
            raise SystemExit(
                f"unknown variant {spec!r}: use contrast=A, minlen-user=F, minlen-all=F, copy=B, hcopy=B, views=W, "
                "oracle=N, beam=B, pbeam=B, recent=N or wrepeat=B"
            )
        try:
            value = float(number)
        except ValueError:
            raise SystemExit(f"{spec!r}: the value after = must be a number") from None
        return cls(spec, kind, value)


class Decoder:
    """The conditioned adapter's greedy decoding with one variant's pick among its top k."""

    def __init__(self, personalizer: Personalizer, second: Engine | None) -> None:
        self.personalizer = personalizer
        self.engine = personalizer.engine
        self.second = second
        self.task = get_task("headline")
        self.ends = set(personalizer.end_tokens)
        # the product's rule only for its word table: `wrepeat` applies the penalty itself, on this script's top k
        self.word_of = RepeatedWordRule(0.0, self.engine.token_bytes).word_of

    def token_count(self, text: str) -> int:
        return len(self.engine.tokenize(" " + text, add_bos=False))

    def copy_tokens(self, article: str, skip: str = "") -> np.ndarray:
        """First tokens of `article`'s words, in their casings, but stop words and words of `skip`."""
        ids: set[int] = set()
        skipped = {word.lower() for word in WORD.findall(skip)}
        for word in WORD.findall(article):
            if word.lower() in STOP_WORDS or word.lower() in skipped:
                continue
            for form in {word, word.lower(), word[:1].upper() + word[1:]}:
                for lead in (" ", ""):
                    tokens = self.engine.tokenize(lead + form, add_bos=False)
                    if tokens:
                        ids.add(tokens[0])
        return np.array(sorted(ids), dtype=np.int64)

    def ends_output(self, tokens: list[int]) -> bool:
        """Whether the last token ends the output (greedy decoding's stop rules: end token or a newline)."""
        token = tokens[-1]
        return (
            token in self.ends
            or self.engine.is_end_of_generation(token)
            or "\n" in self.engine.detokenize(tokens)
        )

    def beam(self, width: int, cond: list[int], shared: int) -> dict[str, tuple[str, int]]:
        """Beam search of `width` beams; the best finished output under three length rules."""
        engine = self.engine
        if 2 * width > engine.batch_sequences:
            raise SystemExit(f"beam={width} needs {2 * width} batched sequences")
        step = engine.prefill(cond, shared=shared)
        start = len(cond)
        max_tokens = self.task.default_max_tokens
        finished: list[tuple[float, list[int]]] = []
        # A beam: (sum of log-probabilities, tokens, its sequence, the logits after its last token).
        beams = [(0.0, [], 0, np.asarray(step.logits, dtype=np.float64))]
        pools = [list(range(1, width + 1)), list(range(width + 1, 2 * width + 1))]
        turn = 0
        while beams:
            expansions: list[tuple[float, list[int], int]] = []
            for score, tokens, sequence, logits in beams:
                scores = log_softmax(logits)
                top = np.argpartition(-scores, TOP_K)[:TOP_K]
                for token in top[np.argsort(-scores[top])][:width]:
                    expansions.append((score + float(scores[token]), tokens + [int(token)], sequence))
            expansions.sort(key=lambda e: -e[0])
            kept: list[tuple[float, list[int], int]] = []
            for expansion in expansions:
                if len(kept) == width:
                    break
                total, tokens, _ = expansion
                if self.ends_output(tokens):
                    finished.append((total, tokens[:-1]))
                elif len(tokens) >= max_tokens:
                    finished.append((total, tokens))
                else:
                    kept.append(expansion)
            if len(finished) >= width or not kept:
                break
            targets = pools[turn]
            turn = 1 - turn
            for target, (_, tokens, parent) in zip(targets, kept, strict=False):
                engine.forget_sequence(target)
                if parent == 0:
                    engine.branch_sequence(target, start)
                else:
                    engine.share_sequence(parent, target, start + len(tokens) - 1)
            for sequence in pools[turn]:
                engine.forget_sequence(sequence)
            logits, _ = engine.eval_sequences(
                [tokens[-1] for _, tokens, _ in kept],
                [start + len(tokens) - 1 for _, tokens, _ in kept],
                targets[: len(kept)],
                all_outputs=True,
            )
            beams = [
                (total, tokens, target, np.asarray(logits[row], dtype=np.float64))
                for row, ((total, tokens, _), target) in enumerate(zip(kept, targets, strict=False))
            ]
        for pool in pools:
            for sequence in pool:
                engine.forget_sequence(sequence)
        rules = {
            "": lambda total, n: total,
            "-mean": lambda total, n: total / max(1, n),
            "-sqrt": lambda total, n: total / max(1.0, n) ** 0.5,
        }
        outputs = {}
        for suffix, rule in rules.items():
            total, tokens = max(finished, key=lambda f: rule(f[0], len(f[1])))
            outputs[suffix] = (engine.detokenize(tokens).split("\n")[0].strip(), len(tokens))
        return outputs

    def decode(
        self,
        variant: Variant,
        cond: list[int],
        shared: int,
        second: list[int],
        min_tokens: int,
        copied: dict[str, np.ndarray],
    ) -> tuple[str, int]:
        step = self.engine.prefill(cond, shared=shared)
        second_step = self.second.prefill(second) if variant.kind in SECOND_CONTEXT and self.second else None
        tokens: list[int] = []
        for _ in range(self.task.default_max_tokens):
            scores = log_softmax(np.asarray(step.logits, dtype=np.float64))
            top = np.argpartition(-scores, TOP_K)[:TOP_K]
            picked = scores[top]
            if second_step is not None:
                other = log_softmax(np.asarray(second_step.logits, dtype=np.float64))[top]
                if variant.kind == "contrast":
                    picked = picked + variant.value * (picked - other)
                else:
                    picked = (1 - variant.value) * picked + variant.value * other
            elif variant.kind in ("copy", "hcopy"):
                picked = picked + variant.value * np.isin(top, copied[variant.kind])
            elif variant.kind == "wrepeat" and tokens:
                seen = {self.word_of(t) for t in tokens} - {""}
                picked = picked - variant.value * np.array([self.word_of(int(t)) in seen for t in top])
            elif variant.kind.startswith("minlen") and len(tokens) < min_tokens:
                picked = np.where(np.isin(top, list(self.ends)), -np.inf, picked)
            token = int(top[np.argmax(picked)])
            if token in self.ends or self.engine.is_end_of_generation(token):
                break
            tokens.append(token)
            if "\n" in self.engine.detokenize(tokens):
                break
            step = self.engine.step(token)
            if second_step is not None:
                second_step = self.second.step(token)
        return self.engine.detokenize(tokens).split("\n")[0].strip(), len(tokens)


def output_names(variants: list[Variant]) -> list[str]:
    """What a run writes: one output per variant, three per beam variant (its length rules)."""
    names = []
    for variant in variants:
        suffixes = ("", "-mean", "-sqrt") if variant.kind in ("beam", "pbeam") else ("",)
        names += [variant.name + suffix for suffix in suffixes]
    return names


def query_record(query: BenchQuery, text: str, n_tokens: int, seconds: float) -> dict:
    """One output as `localpers bench` caches it (timings are this script's, not a cost measurement)."""
    return {
        "query_id": query.id,
        "text": text,
        "rouge1": round(rouge(text, query.reference).rouge1, 6),
        "tokens": n_tokens,
        "ms_per_token": round(1000 * seconds / max(1, n_tokens), 3),
        "prompt_ms": 0.0,
    }


def oracle_index(index: HistoryIndex, query: BenchQuery, recent: int, among: int) -> HistoryIndex:
    """`index` with its closest example replaced by the earlier headline nearest the author's real one."""
    task, pool = index.task, index.pool
    bm25 = index._index
    candidates = [
        i for i in bm25.top(task.content(query.input), among or len(pool)) if i < len(pool) - recent
    ]
    if not candidates:
        return index
    best = max(candidates, key=lambda i: (rouge(pool[i][1], query.reference).rouge1, -candidates.index(i)))
    chosen = HistoryIndex(task, [])
    chosen.pool, chosen._index = pool, FirstThenBm25(bm25, best)
    return chosen


def run_user(
    decoder: Decoder, user: BenchUser, variants: list[Variant], population_median: float, out: Path
) -> None:
    task = decoder.task
    index = HistoryIndex(task, [(i.input, i.output) for i in user.history if i.task == task.name], "bm25")
    user_median = float(np.median([decoder.token_count(i.output) for i in user.history]))
    records = {name: [] for name in output_names(variants)}
    closest_format = dataclasses.replace(decoder.personalizer.prompt_format, recent=0)
    for query in user.queries:
        engine = decoder.engine
        cond, shared = prompting.prompt_tokens(
            engine, task.name, query.input, decoder.personalizer.prompt_format, index
        )
        plain, _ = prompting.prompt_tokens(engine, task.name, query.input, None, None)
        closest: list[int] = []
        if any(v.kind == "views" for v in variants):
            closest, _ = prompting.prompt_tokens(engine, task.name, query.input, closest_format, index)
        shown = index.examples_for(
            query.input,
            decoder.personalizer.prompt_format.examples,
            decoder.personalizer.prompt_format.recent,
        )
        copied = {
            "copy": decoder.copy_tokens(query.input),
            "hcopy": decoder.copy_tokens(" ".join(shown), skip=query.input),
        }
        for variant in variants:
            prompt, prompt_shared = cond, shared
            if variant.kind in ("beam", "pbeam"):
                started = time.perf_counter()
                if variant.kind == "beam":
                    outputs = decoder.beam(int(variant.value), cond, shared)
                else:
                    outputs = decoder.beam(int(variant.value), plain, 0)
                seconds = time.perf_counter() - started
                for suffix, (text, n_tokens) in outputs.items():
                    records[variant.name + suffix].append(query_record(query, text, n_tokens, seconds))
                continue
            if variant.kind == "oracle":
                recent = decoder.personalizer.prompt_format.recent
                oracle = oracle_index(index, query, recent, int(variant.value))
                prompt, prompt_shared = prompting.prompt_tokens(
                    engine, task.name, query.input, decoder.personalizer.prompt_format, oracle
                )
            if variant.kind == "recent":
                shown_format = dataclasses.replace(
                    decoder.personalizer.prompt_format, recent=int(variant.value)
                )
                prompt, prompt_shared = prompting.prompt_tokens(
                    engine, task.name, query.input, shown_format, index
                )
            median = user_median if variant.kind == "minlen-user" else population_median
            min_tokens = int(round(variant.value * median)) if variant.kind.startswith("minlen") else 0
            started = time.perf_counter()
            second = closest if variant.kind == "views" else plain
            text, n_tokens = decoder.decode(variant, prompt, prompt_shared, second, min_tokens, copied)
            seconds = time.perf_counter() - started
            records[variant.name].append(query_record(query, text, n_tokens, seconds))
    for name in output_names(variants):
        folder = out / "cache" / name
        folder.mkdir(parents=True, exist_ok=True)
        record = {"method": name, "user": user.store_name, "queries": records[name]}
        atomic_write_text(folder / f"{user.store_name}.json", json.dumps(record, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="../shared/data/news-headlines/train.jsonl")
    parser.add_argument("--bundle", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--max-queries", type=int, default=5)
    parser.add_argument("--max-users", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    variants = [Variant.parse(spec) for spec in args.variants]
    users = load_bench_users(
        args.data, dev_split=True, max_queries=args.max_queries, max_users=args.max_users
    )
    personalizer = Personalizer.open(bundle=args.bundle, n_threads=args.threads)
    personalizer.engine.set_adapter("global")
    second = None
    if any(v.kind in SECOND_CONTEXT for v in variants):
        second = Engine(personalizer.backbone.path, tap_layers=None, n_threads=args.threads)
        second.load_adapter(personalizer.bundle.adapter_path("global"), "global")
        second.set_adapter("global")
    decoder = Decoder(personalizer, second)
    population_median = float(np.median([decoder.token_count(i.output) for u in users for i in u.history]))
    started = time.perf_counter()
    for number, user in enumerate(users, start=1):
        done = all(
            (args.out / "cache" / name / f"{user.store_name}.json").exists()
            for name in output_names(variants)
        )
        if not done:
            run_user(decoder, user, variants, population_median, args.out)
        print(f"{number}/{len(users)} {user.user_id} {time.perf_counter() - started:.0f}s", flush=True)


if __name__ == "__main__":
    main()
