"""The vocabulary half of the `Engine`: tokens <-> text, the chat template, a sampler chain over the vocabulary.

`Vocabulary` is a base class of `localpers.engine.model.Engine` and needs only the loaded model (`_model`,
`_vocab`, `n_vocab`, `model_path`, `_open_chains`, set by `Engine.__init__`), never the context: it evaluates
nothing, holds no KV cache and knows nothing of adapters. The sampler chains it makes are closed with the engine
(`close_sampler_chains`): a chain holds the vocabulary, and one used after the model was freed aborted.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from localpers.engine.decoding import MethodSampler, SamplerSettings
from localpers.engine.llama import llama_cpp
from localpers.engine.sampler_chain import SamplerChain
from localpers.errors import LocalpersError


class Vocabulary:
    """Tokenize, detokenize and render chats with one llama.cpp model's vocabulary and template."""

    _model: Any
    _vocab: Any
    n_vocab: int
    model_path: Path
    _piece_cache: dict[int, bytes]
    _open_chains: weakref.WeakSet[SamplerChain]

    @property
    def bos_token(self) -> int:
        return int(llama_cpp.llama_vocab_bos(self._vocab))

    @property
    def eos_token(self) -> int:
        return int(llama_cpp.llama_vocab_eos(self._vocab))

    def is_end_of_generation(self, token: int) -> bool:
        if not 0 <= token < self.n_vocab:  # llama.cpp throws std::out_of_range across its C API: an abort
            raise ValueError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of `text`; `add_bos` adds the model's BOS token if the model uses one.

        `special` parses control-token text such as `<start_of_turn>` into those tokens (for prompts
        rendered by `chat_prompt`); user text is never tokenized that way.
        """
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (llama_cpp.llama_token * capacity)()
        count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_bos, special)
        if count < 0:
            capacity = -count
            buffer = (llama_cpp.llama_token * capacity)()
            count = llama_cpp.llama_tokenize(self._vocab, data, len(data), buffer, capacity, add_bos, special)
        return list(buffer[:count])

    @property
    def has_chat_template(self) -> bool:
        """Whether the GGUF carries a chat template (base models such as Gemma 3 270M PT do not)."""
        return bool(llama_cpp.llama_model_chat_template(self._model, None))

    def chat_prompt(self, messages: Sequence[tuple[str, str]]) -> str:
        """`(role, content)` messages rendered with the model's chat template, ending where the reply starts."""
        template = llama_cpp.llama_model_chat_template(self._model, None)
        if not template:
            raise LocalpersError(f"{self.model_path.name} has no chat template; use a completion instead")
        encoded = [(role.encode("utf-8"), content.encode("utf-8")) for role, content in messages]
        chat = (llama_cpp.llama_chat_message * len(encoded))()
        for entry, (role, content) in zip(chat, encoded, strict=True):
            entry.role, entry.content = role, content
        capacity = 256 + 2 * sum(len(role) + len(content) for role, content in encoded)
        for _ in range(2):
            buffer = ctypes.create_string_buffer(capacity)
            size = llama_cpp.llama_chat_apply_template(template, chat, len(encoded), True, buffer, capacity)
            if size < 0:
                raise LocalpersError(
                    f"llama.cpp does not support the chat template of {self.model_path.name}"
                )
            if size <= capacity:
                return buffer.raw[:size].decode("utf-8", errors="replace")
            capacity = size
        raise LocalpersError("the chat template's output kept growing")

    def sampler_chain(
        self, settings: SamplerSettings, method: MethodSampler | None = None, *, final_pick: bool = True
    ) -> SamplerChain:
        """A llama.cpp sampler chain over this model's vocabulary (close it, or use it as a context manager)."""
        chain = SamplerChain(
            self._vocab, self.n_vocab, settings, method, final_pick=final_pick, token_bytes=self.token_bytes
        )
        self._open_chains.add(chain)
        return chain

    def close_sampler_chains(self) -> None:
        """Close every sampler chain still open on this vocabulary (before the model is freed)."""
        for chain in list(self._open_chains):
            chain.close()
        self._open_chains.clear()

    def token_bytes(self, token: int) -> bytes:
        """The raw bytes one token stands for (special tokens render as empty)."""
        cached = self._piece_cache.get(token)
        if cached is not None:
            return cached
        if not 0 <= token < self.n_vocab:  # llama.cpp throws std::out_of_range across its C API: an abort
            raise ValueError(f"token id {token} is outside the vocabulary (0..{self.n_vocab - 1})")
        buffer = ctypes.create_string_buffer(64)
        size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, False)
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, -size, 0, False)
        piece = buffer.raw[:size]
        self._piece_cache[token] = piece
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        """Text of `tokens` (BOS/EOS and other control tokens are dropped)."""
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")
