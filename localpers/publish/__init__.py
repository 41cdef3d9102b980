"""The publisher: from a multi-user corpus to a hashed CARD bundle (extra `[publish]`).

One module per stage (`clusters`, `sft`, `export`, `pairs`, `features`, `head_training`,
`bundle_stage`), a stage cache/runner (`runner`), the corpus reader (`corpus`) and
the wiring (`pipeline.publish`). Importing this package does not import torch.
"""

from localpers.publish.options import STAGES, PublishOptions

__all__ = ["STAGES", "PublishOptions"]
