"""llama.cpp's sampler chain, built from `SamplerSettings`, with a method's own sampler as one link of it.

What it does: create a `llama_sampler_chain` of llama.cpp's built-in samplers in the order documented in
`localpers.engine.decoding`, insert a `MethodSampler` (CARD's correction, CoPe's contrast) as one custom
`llama_sampler` (a `llama_sampler_i` whose `apply`/`accept`/`name` call into Python) after a top-k
cut of the method's own k, and choose a token from one step's logits with it (`sample`); built without a
final pick, it returns the candidates the method left (`transform`, for teacher-forced scoring). An exception in
the method's callback cannot cross llama.cpp: it is kept and raised again once the chain has returned.

What it does not do: evaluate the model (`localpers.engine.evaluation`), stop rules or streaming
(`localpers.engine.generation`).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from localpers.engine.backend import captured_c_stderr, recorded_llama_log
from localpers.engine.decoding import RANDOM_SEED, Candidates, MethodSampler, SamplerSettings
from localpers.engine.llama import llama_cpp
from localpers.engine.repeated_words import CANDIDATES, RepeatedWordRule
from localpers.errors import LocalpersError

# Mirror of `llama_token_data`: {int32 id; float logit; float p}.
TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)

# `name` returns a pointer the sampler owns; a ctypes callback cannot return a c_char_p safely, so it is
# declared as returning an address and cast to the interface's type.
_NAME_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_void_p, llama_cpp.llama_sampler_p_ctypes)


def _c_fill() -> Any:
    """`localpers_fill_candidates` from the compiled extension (`_taps.c`), or None when it was not built."""
    try:
        from localpers import _taps

        function = ctypes.CDLL(_taps.__file__).localpers_fill_candidates
    except (ImportError, OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32]
    function.restype = None
    return function


_FILL_CANDIDATES = _c_fill()


@dataclass(frozen=True)
class Pick:
    """The chosen token and its logit as the end of the chain saw it (after corrections and temperature)."""

    token: int
    logit: float


class _MethodLink:
    """One custom `llama_sampler` whose callbacks run a `MethodSampler` (the chain owns the C object)."""

    def __init__(self, method: MethodSampler) -> None:
        self.method = method
        self.features: np.ndarray | None = None
        self.error: BaseException | None = None
        self._name = ctypes.create_string_buffer(method.name.encode("utf-8"))
        self._name_callback = _NAME_CALLBACK(lambda sampler: ctypes.addressof(self._name))
        self._apply_callback = llama_cpp.llama_sampler_i_apply(self._on_apply)
        self._accept_callback = llama_cpp.llama_sampler_i_accept(self._on_accept)
        interface = llama_cpp.llama_sampler_i()  # every other entry stays NULL: no clone/free/backend
        interface.name = ctypes.cast(self._name_callback, llama_cpp.llama_sampler_i_name)
        interface.apply = self._apply_callback
        interface.accept = self._accept_callback
        self._interface = interface
        self.pointer = llama_cpp.llama_sampler_init(ctypes.byref(self._interface), None)

    def _on_apply(self, sampler: object, array_pointer: object) -> None:
        if self.error is not None:
            return
        try:
            array = array_pointer.contents  # type: ignore[attr-defined]
            size = int(array.size)
            address = ctypes.cast(array.data, ctypes.c_void_p).value
            buffer = (ctypes.c_char * (size * TOKEN_DATA.itemsize)).from_address(address)
            candidates = Candidates(np.frombuffer(buffer, dtype=TOKEN_DATA))
            self.method.apply(candidates, self.features)
            array.size = candidates.size
            array.sorted = False  # the logits changed: later samplers must not trust the old order
        except BaseException as exc:  # raised again by SamplerChain.sample, outside llama.cpp
            self.error = exc

    def _on_accept(self, sampler: object, token: int) -> None:
        if self.error is not None:
            return
        try:
            self.method.accept(int(token))
        except BaseException as exc:
            self.error = exc


class SamplerChain:
    """A llama.cpp sampler chain for one generation; `sample(logits, features)` picks and accepts a token."""

    def __init__(
        self,
        vocab: object,
        n_vocab: int,
        settings: SamplerSettings,
        method: MethodSampler | None = None,
        *,
        final_pick: bool = True,
        token_bytes: Callable[[int], bytes] | None = None,
    ) -> None:
        settings.validated()
        self.final_pick = final_pick
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(params)
        self._link: _MethodLink | None = None
        self._word_link: _MethodLink | None = None
        self.names: list[str] = []
        try:
            self._build(vocab, n_vocab, settings, method, token_bytes)
        except BaseException:
            self.close()
            raise
        self._entries = np.empty(n_vocab, dtype=TOKEN_DATA)
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._address = self._entries.ctypes.data_as(llama_cpp.llama_token_data_p)
        self._array = llama_cpp.llama_token_data_array()

    # ------------------------------------------------------------------ building
    def _add(self, sampler: object, name: str) -> None:
        if not sampler:
            raise LocalpersError(f"llama.cpp could not create the {name} sampler")
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)
        self.names.append(name)

    def _build(
        self,
        vocab: object,
        n_vocab: int,
        settings: SamplerSettings,
        method: MethodSampler | None,
        token_bytes: Callable[[int], bytes] | None,
    ) -> None:
        if settings.grammar is not None:
            with recorded_llama_log() as log, captured_c_stderr() as dumped:
                grammar = llama_cpp.llama_sampler_init_grammar(
                    vocab, settings.grammar.encode("utf-8"), b"root"
                )
            if not grammar:
                # the parser's own line ("parse: error parsing grammar: expecting ')' at ...") says where
                lines = [
                    line.strip() for line in ("".join(dumped) + "".join(log)).splitlines() if line.strip()
                ]
                detail = next(
                    (line for line in lines if "error" in line.lower()), lines[0] if lines else "no detail"
                )
                detail = detail.split("error parsing grammar:", 1)[-1].strip()
                if detail.endswith(" at"):  # the parser quotes the text left from there: none
                    detail += " the end of the grammar"
                raise LocalpersError(f"{settings.grammar_label} is not valid GBNF: {detail}", exit_code=2)
            self._add(grammar, "grammar")
        if settings.logit_bias:
            biases = (llama_cpp.llama_logit_bias * len(settings.logit_bias))()
            for entry, (token, bias) in zip(biases, settings.logit_bias, strict=True):
                if token >= n_vocab:
                    raise LocalpersError(
                        f"logit bias names token {token}, beyond the vocabulary of {n_vocab}", exit_code=2
                    )
                entry.token, entry.bias = token, bias
            self._add(llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(biases), biases), "logit-bias")
        if settings.penalties:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    settings.penalty_last_n,
                    settings.repeat_penalty,
                    settings.frequency_penalty,
                    settings.presence_penalty,
                ),
                "penalties",
            )
        if settings.dry_multiplier > 0.0:
            breakers = (ctypes.c_char_p * len(settings.dry_breakers))(
                *(b.encode("utf-8") for b in settings.dry_breakers)
            )
            self._add(
                llama_cpp.llama_sampler_init_dry(
                    vocab,
                    settings.dry_multiplier,
                    settings.dry_base,
                    settings.dry_allowed_length,
                    settings.penalty_last_n,
                    breakers,
                    len(breakers),
                ),
                "dry",
            )
        if method is not None:
            if method.candidate_limit:
                self._add(
                    llama_cpp.llama_sampler_init_top_k(method.candidate_limit),
                    f"top-k({method.candidate_limit})",
                )
            self._link = _MethodLink(method)
            self._add(self._link.pointer, method.name)
        if settings.word_penalty > 0.0:
            if token_bytes is None:
                raise LocalpersError("the repeated-words rule needs the vocabulary's token text")
            if method is None or not method.candidate_limit:
                # the rule judges a short list; greedy picks the same from it, sampling draws from it
                cut = settings.top_k or CANDIDATES
                self._add(llama_cpp.llama_sampler_init_top_k(cut), f"top-k({cut})")
            self._word_link = _MethodLink(RepeatedWordRule(settings.word_penalty, token_bytes))
            self._add(self._word_link.pointer, RepeatedWordRule.name)
        if settings.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(settings.top_k), "top-k")
        if settings.typical_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_typical(settings.typical_p, 1), "typical")
        if settings.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(settings.top_p, 1), "top-p")
        if settings.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(settings.min_p, 1), "min-p")
        if not self.final_pick:
            return
        if settings.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy(), "greedy")
        else:
            self._add(llama_cpp.llama_sampler_init_temp(settings.temperature), "temperature")
            seed = RANDOM_SEED if settings.seed is None else settings.seed
            self._add(llama_cpp.llama_sampler_init_dist(seed), "dist")

    # ------------------------------------------------------------------ use
    def _run(self, logits: np.ndarray, features: np.ndarray | None) -> Any:
        """Fill the candidates from `logits` and apply every sampler; returns the candidate array."""
        if self._chain is None:
            raise LocalpersError("the sampler chain was closed")
        entries = self._entries
        if len(logits) != len(entries):
            raise ValueError(f"expected {len(entries)} logits, got {len(logits)}")
        if _FILL_CANDIDATES is not None and logits.dtype == np.float32 and logits.flags.c_contiguous:
            _FILL_CANDIDATES(logits.ctypes.data, entries.ctypes.data, len(entries))
        else:  # the same in numpy (about 1 ms for 262k tokens instead of 0.2)
            entries["id"] = self._ids
            entries["logit"] = logits
            entries["p"] = 0.0
        array = self._array
        array.data = self._address
        array.size = len(entries)
        array.selected = -1
        array.sorted = False
        link = self._link
        if link is not None:
            link.features = features
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        self._raise_link_error()
        return array

    def sample(self, logits: np.ndarray, features: np.ndarray | None = None) -> Pick:
        """Run the chain over one step's logits `(n_vocab,)`, accept the chosen token and return it."""
        if not self.final_pick:
            raise LocalpersError("this sampler chain was built without a final pick; use transform()")
        array = self._run(logits, features)
        if not 0 <= array.selected < array.size:
            raise LocalpersError("the sampler chain chose no token")
        chosen = array.data[array.selected]  # samplers may have moved `data`; read through the array
        token, logit = int(chosen.id), float(chosen.logit)
        if logit == -math.inf:
            # every token is ruled out (a grammar beside logit-bias bans): accepting one would make llama.cpp's
            # grammar throw across its C API, which aborts the process
            raise LocalpersError(
                "no token is allowed: the grammar and the logit bias together rule out every token; lift a ban",
                exit_code=2,
            )
        self.accept(token)
        return Pick(token, logit)

    def transform(
        self, logits: np.ndarray, features: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The candidates the chain leaves for one step, `(ids, logits)`, without choosing or accepting one."""
        array = self._run(logits, features)
        address = ctypes.cast(array.data, ctypes.c_void_p).value
        size = int(array.size)
        buffer = (ctypes.c_char * (size * TOKEN_DATA.itemsize)).from_address(address)
        kept = np.frombuffer(buffer, dtype=TOKEN_DATA).copy()
        return kept["id"].astype(np.int64), kept["logit"].astype(np.float32)

    def accept(self, token: int) -> None:
        """Tell every sampler the token that was chosen (or forced) at this step."""
        if self._chain is None:
            raise LocalpersError("the sampler chain was closed")
        llama_cpp.llama_sampler_accept(self._chain, token)
        self._raise_link_error()

    def _raise_link_error(self) -> None:
        for link in (self._link, self._word_link):
            if link is not None and link.error is not None:
                error, link.error = link.error, None
                raise error

    def close(self) -> None:
        """Free the chain and every sampler in it. Safe to call twice."""
        # off the object first, as `Engine.close` does
        chain, self._chain = getattr(self, "_chain", None), None
        if chain:
            llama_cpp.llama_sampler_free(chain)

    def __enter__(self) -> SamplerChain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
