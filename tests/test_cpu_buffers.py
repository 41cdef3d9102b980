"""The CPU buffer-type decision (AMX crash workaround) and the engine applying it to a real load."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from localpers.engine import cpu_buffers
from localpers.engine.cpu_buffers import BufferSettingError, choose_buffer_types

AMX_CPU_FLAGS = {"avx2", "avx512f", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile"}
AMX_BUILD_OFFERS = ("AMX", "CPU_REPACK")  # what ggml offers on a Sapphire Rapids host, in its order


@pytest.mark.parametrize("setting", ["auto", "repack", "plain"])
def test_amx_cpu_never_gets_the_amx_buffer_type(setting: str) -> None:
    choice = choose_buffer_types(AMX_BUILD_OFFERS, setting, AMX_CPU_FLAGS)
    assert "AMX" not in choice.allowed
    assert "amx_int8" in choice.reason or setting == "repack" or "AMX" in choice.reason


def test_auto_keeps_repack_on_an_amx_cpu_and_says_why() -> None:
    choice = choose_buffer_types(AMX_BUILD_OFFERS, "auto", AMX_CPU_FLAGS)
    assert choice.allowed == ("CPU_REPACK",)
    assert choice.use_extra_buffers
    assert "AMX left out" in choice.reason and "20824" in choice.reason


def test_all_is_llamas_own_choice_and_plain_is_none() -> None:
    assert choose_buffer_types(AMX_BUILD_OFFERS, "all", AMX_CPU_FLAGS).allowed == AMX_BUILD_OFFERS
    plain = choose_buffer_types(AMX_BUILD_OFFERS, "plain", AMX_CPU_FLAGS)
    assert plain.allowed == () and not plain.use_extra_buffers


def test_auto_keeps_every_working_type_in_order() -> None:
    offered = ("KLEIDIAI", "CPU_REPACK")
    assert choose_buffer_types(offered, "auto", {"asimd"}).allowed == offered
    assert choose_buffer_types((), "auto", set()).allowed == ()
    assert choose_buffer_types(("KLEIDIAI",), "repack", set()).allowed == ()


def test_unknown_setting_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_buffers.ENV_VAR, "fastest")
    with pytest.raises(BufferSettingError, match="LOCALPERS_CPU_BUFFERS='fastest'"):
        cpu_buffers.setting_from_environment()
    monkeypatch.setenv(cpu_buffers.ENV_VAR, " Repack ")
    assert cpu_buffers.setting_from_environment() == "repack"


def test_cpu_flags_reads_the_flags_line(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_tile amx_int8\n\nprocessor\t: 1\n")
    flags = cpu_buffers.cpu_flags(cpuinfo)
    assert cpu_buffers.amx_flags(flags) == ["amx_int8", "amx_tile"]
    assert cpu_buffers.cpu_flags(tmp_path / "missing") == frozenset()


# ----------------------------------------------------------------- the engine, on the real backbone
@pytest.mark.slow
@pytest.mark.parametrize("setting", ["auto", "repack", "plain"])
def test_engine_loads_and_decodes_under_every_setting(backbone, monkeypatch, setting: str) -> None:
    from localpers.engine import Engine, cpu_extra_buffer_types

    monkeypatch.setenv(cpu_buffers.ENV_VAR, setting)
    offered_before = cpu_extra_buffer_types()
    with Engine(backbone.path, n_ctx=64, tap_layers=None) as engine:
        assert engine.buffer_choice.setting == setting
        assert "AMX" not in engine.buffer_choice.allowed
        assert engine.weight_buffers, "the load log reported no model buffer"
        extra_used = set(engine.weight_buffers) & set(offered_before)
        assert extra_used <= set(engine.buffer_choice.allowed)
        if setting == "plain":
            assert not extra_used
        elif "CPU_REPACK" in offered_before:
            assert "CPU_REPACK" in engine.weight_buffers
        tokens = engine.tokenize("The weather today is")
        logits, _ = engine.eval(tokens)
        assert logits.shape == (engine.n_vocab,) and float(abs(logits).max()) > 0
    # The CPU device's list is restored after each load.
    assert cpu_extra_buffer_types() == offered_before


@pytest.mark.slow
def test_removing_an_offered_type_really_keeps_weights_out_of_it(backbone) -> None:
    """The in-place list edit (what keeps AMX out on an AMX CPU) is exercised on the type this CPU has."""
    from localpers.engine import _only_extra_buffer_types, cpu_extra_buffer_types

    offered = cpu_extra_buffer_types()
    if not offered:
        pytest.skip("this llama.cpp build offers no extra CPU buffer type")
    import llama_cpp

    from localpers.engine import backend, ggml_buffers

    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    params.use_extra_bufts = True
    for keep in ([], offered[:1]):
        backend._log_recorder.recording = []
        try:
            with _only_extra_buffer_types(keep):
                assert cpu_extra_buffer_types() == keep
                model = llama_cpp.llama_model_load_from_file(str(backbone.path).encode(), params)
            log = "".join(backend._log_recorder.recording)
        finally:
            backend._log_recorder.recording = None
        assert model
        llama_cpp.llama_model_free(model)
        placed = {name for name, _ in ggml_buffers.BUFFER_SIZE_LINE.findall(log)}
        assert not (placed & (set(offered) - set(keep))), f"weights went to a removed type: {placed}"
        if keep == ["CPU_REPACK"]:
            assert "CPU_REPACK" in placed
    assert cpu_extra_buffer_types() == offered


def test_every_setting_pair_differs_only_where_it_should() -> None:
    for a, b in itertools.combinations(cpu_buffers.SETTINGS, 2):
        choice_a = choose_buffer_types(AMX_BUILD_OFFERS, a, AMX_CPU_FLAGS)
        choice_b = choose_buffer_types(AMX_BUILD_OFFERS, b, AMX_CPU_FLAGS)
        if {a, b} == {"auto", "repack"}:
            assert choice_a.allowed == choice_b.allowed
        else:
            assert choice_a.allowed != choice_b.allowed
