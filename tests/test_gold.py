"""Gold likelihood: the teacher-forced log-probability of the author's headline, through the generating path.

The forced loop is checked against the engine's batched scorer (an independent computation), the CARD
correction at strength 0 against the cluster model, and the bench's aggregate against its per-query values.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_bench import data_file, first_run, personalizer  # noqa: F401 - shared fixtures

from localpers.engine.generation import generate
from localpers.methods.card.personalizer import Personalizer
from localpers.tasks import get_task

ARTICLE = "Generate a headline for the following article: The bakery opened a second shop downtown."
REFERENCE = "BAKERY DOUBLES UP!!!"
# batch-vs-single decoding differs by up to ~0.1 nats per likely token on the AMD development CPUs
# (docs/PERFORMANCE.md); on unlikely tokens (log p ~ -10, synthetic adapter) it was measured at 0.2, i.e.
# ~2% of the value. On an AMX Xeon (AVX-512 kernels, CPU_REPACK, one thread) this very prompt showed 0.207
# at a token of log p -1.08 (fourteenth session); 0.25 is 1.2x that largest gap seen on any CPU.
BATCH_NOISE = 0.25
BATCH_NOISE_RELATIVE = 0.03


def test_forced_loop_matches_the_batched_scorer(personalizer: Personalizer) -> None:  # noqa: F811
    engine = personalizer.engine
    engine.set_adapter("global")
    prompt = engine.tokenize(get_task("headline").prompt_for(ARTICLE))
    target = engine.tokenize(" " + REFERENCE + "\n", add_bos=False)
    forced = generate(engine, prompt, forced=target)
    (batched,) = engine.score(prompt, [target])
    assert forced.tokens == target and len(forced.token_logprobs) == len(target)
    np.testing.assert_allclose(
        forced.token_logprobs, batched.logprobs, atol=BATCH_NOISE, rtol=BATCH_NOISE_RELATIVE
    )
    assert all(lp <= 0 for lp in forced.token_logprobs)


def test_card_at_strength_zero_scores_like_the_cluster_model(personalizer: Personalizer) -> None:  # noqa: F811
    cluster = personalizer.rewrite(ARTICLE, method="cluster", cluster=0, reference=REFERENCE, max_tokens=4)
    zero = personalizer.rewrite(
        ARTICLE, method="card", cluster=0, vector=None, strength=0.0, reference=REFERENCE, max_tokens=4
    )
    strong = personalizer.rewrite(
        ARTICLE,
        method="card",
        cluster=0,
        vector=np.linspace(-1.0, 1.0, personalizer.head.d).astype(np.float32),
        strength=5.0,
        reference=REFERENCE,
        max_tokens=4,
    )
    assert cluster.gold_tokens == zero.gold_tokens == strong.gold_tokens > 0
    assert zero.gold_logprob == pytest.approx(cluster.gold_logprob, abs=1e-4)
    assert strong.gold_logprob != pytest.approx(cluster.gold_logprob, abs=1e-3)  # the correction is scored
    assert (
        "gold_logprob"
        not in personalizer.rewrite(ARTICLE, method="cluster", cluster=0, max_tokens=2).to_json()
    )


def test_bench_reports_gold_likelihood_with_paired_intervals(first_run) -> None:  # noqa: F811
    _, written, _ = first_run
    results = written.results
    for name in ("global", "rag", "cluster", "card"):
        row = results["methods"][name]
        values = [q["gold_logprob"] for r in written.run.records[name] for q in r["queries"]]
        assert row["gold_logprob"] == pytest.approx(np.mean(values), abs=1e-4) and row["gold_logprob"] < 0
        low, mean, high = row["gold_logprob_ci"]
        assert low <= mean <= high and row["gold_perplexity"] > 1
    low, mean, high = results["deltas_vs_global"]["card"]["gold_logprob"]
    assert low <= mean <= high
    assert mean == pytest.approx(
        results["methods"]["card"]["gold_logprob"] - results["methods"]["global"]["gold_logprob"], abs=1e-4
    )
    assert "## Gold likelihood" in written.report_path.read_text()


def test_several_corrections_scored_in_one_pass_equal_separate_scoring(personalizer: Personalizer) -> None:  # noqa: F811
    from localpers.methods.card.correction import CorrectionVariant
    from localpers.methods.card.token_bias import TokenBias

    engine = personalizer.engine
    habit = engine.tokenize(" BAKERY", add_bos=False)[0]
    bias = TokenBias(first={habit: 2.0}, rest={engine.tokenize("!!!", add_bos=False)[0]: 1.0})
    vector = np.linspace(-1.0, 1.0, personalizer.head.d).astype(np.float32)
    variants = [
        CorrectionVariant(vector, 0.0, None, 0.0),
        CorrectionVariant(vector, 5.0, None, 0.0),
        CorrectionVariant(vector, 0.0, bias, 1.0),
        CorrectionVariant(vector, 5.0, bias, 3.0),
    ]
    together = personalizer.score_reference_variants(ARTICLE, REFERENCE, variants, cluster=0)
    apart = [
        personalizer.score_reference(
            ARTICLE,
            REFERENCE,
            cluster=0,
            vector=v.vector,
            strength=v.strength,
            bias=v.bias,
            bias_strength=v.bias_strength,
        )
        for v in variants
    ]
    np.testing.assert_allclose(together, apart, atol=1e-6)
    assert len({round(score, 4) for score in together}) == 4, "each correction should score differently"
    cluster = personalizer.rewrite(ARTICLE, method="cluster", cluster=0, reference=REFERENCE, max_tokens=2)
    assert together[0] == pytest.approx(cluster.gold_logprob, abs=1e-4)  # strength 0, no bias: the model
    assert together[2] > together[0], "the habit's bias must raise the reference's likelihood"
