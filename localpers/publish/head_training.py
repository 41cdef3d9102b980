"""Stage `head`: train the shared CARD head (P, Q) jointly with one vector lambda per training user.

Exactly the maths of `localpers.methods.card.head` (factored U = E Q, E = the backbone's token embeddings; with
`head_u = "full"`, one free row of U per token seen in the pairs instead):
`z_t = P f_t` on the stored normalised features, `u_t = E[y_t] Q`, `g(y) = alpha * sum_t u_t * z_t`
(over T when length-normalised), `R(y) = lambda_u . g(y)`. Loss: Bradley-Terry
`-log sigmoid(R(y+) - R(y-))`, full-batch AdamW with weight decay. A seeded `head_holdout` slice of each
user's pairs is never trained on; on it we report the fraction with `R(y+) > R(y-)` using the user's own
lambda, the cluster's default vector (mean lambda of its users), the global default (mean of all),
and a lambda refitted the way the device does it (L2 logistic regression on `g(y+) - g(y-)` of the
user's training pairs, P and Q frozen). Output: `head.safetensors` via `CardHead.save`.

With `head_author_negatives = N > 0`, each training pair also contributes N *author-vs-author* pairs:
the same `y+` against the own text of another training user of the same cluster (a `y+` of one of
their training pairs, so another prompt), so the head can learn what separates this author from
similar authors and not only people from the cluster model. `author_own_lambda` reports, on held-out
pairs, how often an author's own lambda ranks their text above a same-cluster author's.
The stage is one task of the run's executor (`run_as_task`), on the CPU.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from localpers.engine import llama  # noqa: F401  (before torch, as `engine.torch_model` says why)
from localpers.engine.token_embeddings import TokenEmbeddings
from localpers.errors import InputError
from localpers.methods.bounds import MAX_STRENGTH
from localpers.methods.card.head import CardHead
from localpers.methods.card.head_spec import HeadConfig
from localpers.publish.executor import GIB, Resources, Task
from localpers.publish.head_data import PairData, author_negative_pairs, holdout_mask, load_pair_data
from localpers.publish.options import card_base
from localpers.publish.runner import ContextSpec, PublishContext, task_context, write_json_atomic

HEAD_FILE = "head.safetensors"
EVAL_EVERY = 10


class TorchHead:
    """Differentiable twin of `CardHead.sequence_feature`, factored (`U = E Q`) or full.

    A full U has one trainable row per token seen in the pairs (`unique_rows`), initialised to the
    factored head's starting `E[v] Q`; tokens never seen keep a zero row on the device.
    """

    def __init__(
        self,
        n_features: int,
        unique_rows: Any,
        d: int,
        n_users: int,
        seed: int,
        full_u: bool = False,
    ):
        import torch

        n_embd = unique_rows.shape[1]
        embedding_rms = float(np.sqrt(np.mean(unique_rows.numpy() ** 2)))  # numpy: same bits as before
        generator = torch.Generator().manual_seed(seed)
        self.P = (torch.randn(d, n_features, generator=generator) / n_features**0.5).requires_grad_()
        q_scale = 0.1 / (n_embd**0.5 * max(embedding_rms, 1e-6))
        self.Q = (torch.randn(n_embd, d, generator=generator) * q_scale).requires_grad_()
        self.lambdas = torch.ones(n_users, d).requires_grad_()
        self.U: Any = None
        if full_u:
            self.U = (unique_rows @ self.Q).detach().requires_grad_()
            self.Q = torch.eye(d)

    def parameters(self) -> list[Any]:
        return [self.P, self.U if self.U is not None else self.Q, self.lambdas]

    def token_inputs(self, embedding_rows: Any, token_index: Any) -> Any:
        """What `sequence_features` multiplies by `Q`: embedding rows, or (full U, Q = I) the U rows."""
        return embedding_rows if self.U is None else self.U[token_index]


def sequence_features(
    P: Any,
    Q: Any,
    features: Any,
    embedding_rows: Any,
    sequence: Any,
    n_seq: int,
    lengths: Any,
    alpha: float,
    length_normalised: bool,
) -> Any:
    """g for every sequence, `(n_seq, D)`: alpha * sum over the sequence's tokens of (E[y_t] Q) * (P f_t)."""
    import torch

    z = features @ P.T
    u = embedding_rows @ Q
    g = torch.zeros(n_seq, P.shape[0], dtype=z.dtype).index_add_(0, sequence, u * z) * alpha
    if length_normalised:
        g = g / lengths.clamp(min=1).unsqueeze(1).to(g.dtype)
    return g


def head_task(spec: ContextSpec) -> dict[str, Any]:
    """Task: the whole head stage where the executor puts it (one task: it needs every user's features)."""
    context = task_context(spec)
    return run(context, context.stage_dir("head"))


def task_resources(context: PublishContext) -> Resources:
    """What the head task declares: `threads` CPUs and an SFT task's memory (this trainer uses no GPU)."""
    return Resources(cpus=context.options.threads, memory=int(context.options.task_memory_gb * GIB))


def run_as_task(context: PublishContext, directory: Path) -> dict[str, Any]:
    """The `head` stage through the run's executor."""
    return context.executor.map([Task(head_task, (context.spec(),), "head")], task_resources(context))[0]


def run(context: PublishContext, directory: Path) -> dict[str, Any]:
    import torch

    options = context.options
    torch.set_num_threads(options.threads)
    torch.manual_seed(options.seed)
    data = load_pair_data(context)
    k = context.summary("clusters")["k"]
    tap_layers = context.summary("features")["tap_layers"]
    embeddings = TokenEmbeddings(context.backbone_path)
    unique, inverse = np.unique(data.tokens, return_inverse=True)
    unique_rows = embeddings.rows(unique)
    held = holdout_mask(data, options.head_holdout, options.seed)
    config = HeadConfig(
        d=options.head_d,
        layers=tuple(tap_layers),
        u=options.head_u,
        alpha=1.0,
        top_k=options.head_top_k,
        length_normalised=options.length_normalised,
        base=card_base(options),
    )
    features = torch.from_numpy(data.features.astype(np.float32))
    rows = torch.from_numpy(unique_rows)[torch.from_numpy(inverse)]
    sequence = torch.from_numpy(data.sequence)
    lengths = torch.from_numpy(data.lengths)
    n_seq = len(data.lengths)
    token_index = torch.from_numpy(inverse.reshape(-1))
    head = TorchHead(
        features.shape[1],
        torch.from_numpy(unique_rows),
        config.d,
        len(data.user_ids),
        options.seed,
        full_u=config.u == "full",
    )

    train_seq = np.flatnonzero(np.repeat(~held, 2))
    token_in_train = np.isin(data.sequence, train_seq)
    remap = -np.ones(n_seq, dtype=np.int64)
    remap[train_seq] = np.arange(len(train_seq))
    train_features = features[torch.from_numpy(token_in_train)]
    train_rows = rows[torch.from_numpy(token_in_train)]
    train_token_index = token_index[torch.from_numpy(token_in_train)]
    train_sequence = torch.from_numpy(remap[data.sequence[token_in_train]])
    train_lengths = lengths[torch.from_numpy(train_seq)]
    # Every training comparison as (sequence of the preferred text, sequence of the other, user row).
    train_pairs = np.flatnonzero(~held)
    cross = author_negative_pairs(data, ~held, options.head_author_negatives, options.seed)
    preferred = np.concatenate([2 * train_pairs, 2 * cross[:, 0]])
    other = np.concatenate([2 * train_pairs + 1, 2 * cross[:, 1]])
    comparison_user = np.concatenate([data.pair_user[train_pairs], data.pair_user[cross[:, 0]]])
    train_preferred = torch.from_numpy(remap[preferred])
    train_other = torch.from_numpy(remap[other])
    train_comparison_user = torch.from_numpy(comparison_user)

    optimizer = torch.optim.AdamW(
        head.parameters(), lr=options.head_lr, weight_decay=options.head_weight_decay
    )
    curve: list[dict[str, float]] = []
    started = time.perf_counter()
    with context.progress("head (Bradley-Terry)", options.head_steps) as advance:
        for step in range(options.head_steps):
            g = sequence_features(
                head.P,
                head.Q,
                train_features,
                head.token_inputs(train_rows, train_token_index),
                train_sequence,
                len(train_seq),
                train_lengths,
                config.alpha,
                config.length_normalised,
            )
            margin = ((g[train_preferred] - g[train_other]) * head.lambdas[train_comparison_user]).sum(-1)
            loss = torch.nn.functional.softplus(-margin).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if step % EVAL_EVERY == 0 or step == options.head_steps - 1:
                point = {
                    "step": step,
                    "train_loss": round(float(loss.detach()), 5),
                    "train_accuracy": round(float((margin > 0).float().mean()), 4),
                }
                point["heldout_accuracy_own"] = _accuracy(
                    head, features, rows, token_index, sequence, lengths, data, held, config
                )
                curve.append(point)
            advance(1)
    train_seconds = time.perf_counter() - started

    lambdas = head.lambdas.detach().numpy()
    defaults = np.zeros((k + 1, config.d), dtype=np.float32)
    for c in range(k):
        members = np.flatnonzero(data.user_cluster == c)
        defaults[c] = lambdas[members].mean(axis=0) if len(members) else lambdas.mean(axis=0)
    defaults[k] = lambdas.mean(axis=0)
    with torch.no_grad():
        all_inputs = head.token_inputs(rows, token_index)
        g_all = sequence_features(
            head.P,
            head.Q,
            features,
            all_inputs,
            sequence,
            n_seq,
            lengths,
            config.alpha,
            config.length_normalised,
        ).numpy()
    diffs = g_all[0::2] - g_all[1::2]
    token_correction = _mean_abs_token_correction(head, features, all_inputs, data, defaults)
    if options.head_target_correction:
        # Rewards are scale-free for the pair ranking; alpha sets how hard the device pushes the logits.
        config = replace(config, alpha=calibrated_alpha(options.head_target_correction, token_correction))
    diffs = diffs * config.alpha
    accuracies = {
        "own_lambda": _fraction((diffs * lambdas[data.pair_user]).sum(-1) > 0, held),
        "cluster_default": _fraction((diffs * defaults[data.pair_cluster]).sum(-1) > 0, held),
        "global_default": _fraction((diffs @ defaults[k]) > 0, held),
        "device_refit": _refit_accuracy(diffs, data, held),
        "train_own_lambda": _fraction((diffs * lambdas[data.pair_user]).sum(-1) > 0, ~held),
        "author_own_lambda": _author_accuracy(g_all, lambdas, data, held, options.seed),
    }
    if head.U is None:
        card = CardHead(
            config, head.P.detach().numpy(), defaults, factor_q=head.Q.detach().numpy(), embeddings=embeddings
        )
    else:
        card = CardHead(
            config, head.P.detach().numpy(), defaults, u_ids=unique, u_rows=head.U.detach().numpy()
        )
    card.save(directory / HEAD_FILE)
    summary = {
        "config": config.to_manifest(),
        "pairs": int(data.n_pairs),
        "author_negative_pairs": int(len(cross)),
        "heldout_pairs": int(held.sum()),
        "users": len(data.user_ids),
        "tokens": int(data.tokens.size),
        "steps": options.head_steps,
        "train_seconds": round(train_seconds, 1),
        "heldout_accuracy": accuracies,
        "trained_mean_abs_token_correction": round(token_correction, 4),
        "alpha": config.alpha,
        "curve": curve,
    }
    write_json_atomic(directory / "head_report.json", summary)
    context.log("head held-out pair accuracy: " + ", ".join(f"{k_}={v}" for k_, v in accuracies.items()))
    return summary


def _fraction(correct: np.ndarray, mask: np.ndarray) -> float:
    return round(float(correct[mask].mean()), 4) if mask.any() else float("nan")


def _accuracy(
    head: TorchHead,
    features: Any,
    rows: Any,
    token_index: Any,
    sequence: Any,
    lengths: Any,
    data: PairData,
    held: np.ndarray,
    config: HeadConfig,
) -> float:
    import torch

    if not held.any():
        return float("nan")
    with torch.no_grad():
        g = sequence_features(
            head.P,
            head.Q,
            features,
            head.token_inputs(rows, token_index),
            sequence,
            len(data.lengths),
            lengths,
            config.alpha,
            config.length_normalised,
        )
        margin = ((g[0::2] - g[1::2]) * head.lambdas[torch.from_numpy(data.pair_user)]).sum(-1).numpy()
    return _fraction(margin > 0, held)


def _author_accuracy(
    g_all: np.ndarray, lambdas: np.ndarray, data: PairData, held: np.ndarray, seed: int
) -> float:
    """Held-out: fraction where the author's lambda ranks their own text above a same-cluster author's."""
    pairs = author_negative_pairs(data, held, 3, seed + 1)
    if len(pairs) == 0:
        return float("nan")
    own, other = g_all[2 * pairs[:, 0]], g_all[2 * pairs[:, 1]]
    margin = ((own - other) * lambdas[data.pair_user[pairs[:, 0]]]).sum(-1)
    return round(float((margin > 0).mean()), 4)


def _refit_accuracy(diffs: np.ndarray, data: PairData, held: np.ndarray) -> float:
    """Held-out accuracy when each user's lambda is refitted from their training pairs only (device style)."""
    from sklearn.linear_model import LogisticRegression

    correct, total = 0, 0
    for row in range(len(data.user_ids)):
        train = (data.pair_user == row) & ~held
        test = (data.pair_user == row) & held
        if not train.any() or not test.any():
            continue
        x = np.concatenate([diffs[train], -diffs[train]])
        y = np.concatenate([np.ones(train.sum()), np.zeros(train.sum())])
        model = LogisticRegression(fit_intercept=False, C=1.0, max_iter=1000).fit(x, y)
        correct += int(((diffs[test] @ model.coef_[0]) > 0).sum())
        total += int(test.sum())
    return round(correct / total, 4) if total else float("nan")


def _mean_abs_token_correction(
    head: TorchHead, features: Any, token_inputs: Any, data: PairData, defaults: np.ndarray
) -> float:
    """Mean over all pair tokens of |U[y_t] . (z_t * lambda_cluster)| at alpha = 1, in logits."""
    import torch

    seq_cluster = np.repeat(data.pair_cluster, 2)[data.sequence]
    with torch.no_grad():
        per_token = (
            (token_inputs @ head.Q) * (features @ head.P.T) * torch.from_numpy(defaults[seq_cluster])
        ).sum(-1)
    return float(per_token.abs().mean())


def calibrated_alpha(target_correction: float, token_correction: float) -> float:
    """The head's alpha that makes its mean |per-token correction| `target_correction` logits, where alpha 1 gives
    `token_correction`; refused (one line, before the bundle is written) over the MAX_STRENGTH a bundle may state,
    which a device would refuse only after the whole publish."""
    alpha = round(target_correction / max(token_correction, 1e-9), 6)
    if alpha > MAX_STRENGTH:
        highest = MAX_STRENGTH * token_correction
        raise InputError(
            f"the head's calibrated alpha would be {alpha:.4g} ({target_correction:g} logits / a mean token correction"
            f" of {token_correction:.3g} at alpha 1), over the {MAX_STRENGTH:g} a bundle may state: give"
            f" --head-target-correction {highest:.3g} or less (`--from-stage head`)"
        )
    return alpha
