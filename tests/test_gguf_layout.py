"""`gguf_layout` reads the same tensor layout as gguf's own `GGUFReader`, in milliseconds, and refuses bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localpers.engine.backbone import Backbone
from localpers.engine.gguf_layout import GGUFLayout, TensorLocation, gguf_layout, map_tensor
from localpers.errors import LocalpersError

gguf = pytest.importorskip("gguf")


def reference_layout(reader: object) -> GGUFLayout:
    """The layout as gguf-py's reader sees it (the library this module must agree with)."""
    field = reader.fields.get("general.architecture")
    return GGUFLayout(
        architecture=bytes(field.parts[field.data[0]]).decode() if field else "",
        tensors=tuple(
            TensorLocation(
                name=t.name,
                type=int(t.tensor_type),
                offset=int(t.data_offset),
                n_bytes=int(t.n_bytes),
                shape=tuple(int(n) for n in t.shape),
                data_dtype=t.data.dtype.str,
                data_shape=tuple(int(n) for n in t.data.shape),
            )
            for t in reader.tensors
        ),
    )


def described(layout: GGUFLayout) -> list[tuple]:
    """Everything a layout says, numpy dtypes compared by value ('<f4' is float32 on this machine)."""
    return [
        (t.name, t.type, t.offset, t.n_bytes, t.shape, np.dtype(t.data_dtype), t.data_shape)
        for t in layout.tensors
    ]


def write_gguf(
    path: Path, metadata: dict[str, object], tensors: dict[str, np.ndarray], alignment: int = 0
) -> None:
    writer = gguf.GGUFWriter(str(path), "gemma3")
    if alignment:
        writer.add_custom_alignment(alignment)
    for key, value in metadata.items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_uint32(key, int(value))
    for name, array in tensors.items():
        if array.dtype == np.uint8:  # raw Q8_0 blocks: 34 bytes hold 32 weights
            writer.add_tensor(name, array, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_backbone_layout_is_the_one_gguf_reads(backbone: Backbone) -> None:
    layout = gguf_layout(backbone.path)
    reader = gguf.GGUFReader(str(backbone.path))  # ~10 s: it walks the whole vocabulary
    expected = reference_layout(reader)
    assert layout.architecture == "gemma3" and len(layout.tensors) == 236
    assert described(layout) == described(expected)
    for location, tensor in zip(layout.tensors[:3], reader.tensors[:3], strict=True):
        assert np.array_equal(map_tensor(backbone.path, location), tensor.data)


def test_written_files_of_every_plain_type_and_a_quantised_one_read_as_gguf_reads_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "small.gguf"
    tensors = {
        "a.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b.weight": np.arange(8, dtype=np.float16),
        "c.weight": np.arange(6, dtype=np.int8).reshape(2, 3),
        "d.weight": np.arange(4, dtype=np.int32),
        "f.weight": np.arange(3, dtype=np.float64),
        "g.weight": np.arange(5, dtype=np.int16),
        "h.weight": np.arange(2, dtype=np.int64),
        "e.weight": np.zeros((2, 68), dtype=np.uint8),  # two rows of 64 Q8_0 weights
    }
    metadata = {
        "tokenizer.ggml.tokens": ["a", "bb", "ccc"] * 50,
        "tokenizer.ggml.scores": [0.5] * 150,
        "x.n": 7,
    }
    write_gguf(path, metadata, tensors, alignment=64)
    layout = gguf_layout(path)
    assert layout.architecture == "gemma3" and described(layout) == described(
        reference_layout(gguf.GGUFReader(str(path)))
    )
    assert layout.tensor("e.weight").shape == (64, 2) and layout.tensor("e.weight").data_shape == (2, 68)
    assert np.array_equal(map_tensor(path, layout.tensor("a.weight")), tensors["a.weight"])
    assert np.array_equal(map_tensor(path, layout.tensor("b.weight")), tensors["b.weight"])


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda raw: b"GGML" + raw[4:], "no GGUF magic"),
        (lambda raw: raw[:4] + (9).to_bytes(4, "little") + raw[8:], "GGUF version 9"),
        (lambda raw: raw[:200], "past the end"),
        (lambda raw: raw[:20], r"is truncated \(20 bytes\): not a complete GGUF file$"),
        (lambda raw: b"", "cannot read"),
    ],
)
def test_a_damaged_file_is_refused_in_one_line_naming_it(tmp_path: Path, damage, why: str) -> None:
    path = tmp_path / "small.gguf"
    write_gguf(
        path, {"tokenizer.ggml.tokens": ["tok"] * 100}, {"a.weight": np.ones((4, 4), dtype=np.float32)}
    )
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(LocalpersError, match=why) as refused:
        gguf_layout(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_the_value_type_table_is_ggufs() -> None:
    from localpers.engine import gguf_layout as module

    value_type = gguf.GGUFValueType
    assert (module._UINT32, module._STRING, module._ARRAY) == (
        value_type.UINT32,
        value_type.STRING,
        value_type.ARRAY,
    )
    scalars = gguf.GGUFReader.gguf_scalar_to_np
    assert set(module._SCALAR_SIZES) == {int(kind) for kind in scalars}
    assert all(
        np.dtype(scalars[value_type(kind)]).itemsize == size for kind, size in module._SCALAR_SIZES.items()
    )


def test_single_metadata_values_are_the_ones_gguf_reads(tmp_path: Path) -> None:
    path = tmp_path / "adapter.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_string("general.type", "adapter")
    writer.add_float32("adapter.lora.alpha", 32.0)
    writer.add_int32("x.signed", -5)
    writer.add_uint64("x.big", 2**40)
    writer.add_float64("x.double", 0.125)
    writer.add_bool("x.flag", True)
    writer.add_array("x.list", [1, 2, 3])
    writer.add_tensor("a.weight", np.ones((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    values = gguf_layout(path).values
    reader = gguf.GGUFReader(str(path))
    expected = {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    assert values == {key: value for key, value in expected.items() if not isinstance(value, list)}
    assert values["general.type"] == "adapter" and values["x.signed"] == -5 and "x.list" not in values
