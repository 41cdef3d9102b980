"""The users of this device and their writing: where user text is stored and how it is read.

- `store`: the users of this device (list, create, active, delete, export/import), one folder each.
- `staging`: the hidden folders a user is built in or deleted through, so each appears and goes in one rename.
- `folder`: one user's folder (history, fitted state, vector, per-method files), every write atomic.
- `vector_file`: the user vector's safetensors file, made and read checked.
- `archive`: `localpers user export|import` archives of one user's folder.
- `archive_members`: which of a user's files an export archive carries, and the mark on a fit without its history.
- `history`: history items, their ids and limits, and the stored history.jsonl.
- `history_import`: the JSONL files a user imports (formats, dates, duplicates, `--keep-latest`).
- `dates`, `ordinals`: items' optional dates, and each item's place in the order items were added.
- `lock`, `names`: one writer at a time per user; which user names are allowed.
- `history_prompt`: the user's own earlier outputs shown in front of a task prompt (the composition).
- `history_index`: a user's examples per task with their BM25 index, cached; the prompt entry points.
- `series`: formulas a user repeats, and when a prompt shows one.
- `retrieval`: BM25 over a user's history.

This package runs no model and knows no method: methods read users through it.
"""
