"""CARD, the method localpers is named after: cluster adapter + reward-guided top-k logit correction.

Where each part is computed:

- `correction`: the correction itself, one sampler of llama.cpp's chain (`CardCorrection`, `build_correction`).
- `head`: the personalization head (features -> z, sequence rewards, `U[v]`).
- `fitting`: the user vector lambda from preference-pair features (Bradley-Terry, held-out check).
- `token_bias`: the user's sparse token bias, CARD's second term.
- `choice`: the per-user choice of the correction's strengths, made at fit time.
- `pairs`: preference pairs (y+ = the user's output, y- = the base adapter's, `head.base`) and their features.
- `cluster_assignment`: the user's style cluster, the nearest of the bundle's centroids.
- `decoding_runs`: a rewrite's decode (one candidate or consensus), teacher-forced scoring, the Why view's steps.
- `personalizer`: `Personalizer`, the backbone with the bundle loaded, which fits and rewrites.
- `method`: CARD as a registry method, and `AdapterMethod`, the rewrite path it shares with the baselines
  (`localpers.methods.baselines`: global, cluster, card-global, global-history).
"""
