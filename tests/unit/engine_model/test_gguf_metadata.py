"""The quick GGUF metadata reader gives exactly what gguf's own GGUFReader gives, on the shipped
SmolLM2 file and on files holding every value type in either byte order; a tokenizer is read
from its own keys alone; a cut or foreign file is a clear error, not a traceback."""
from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from laps_agent.modelio.gguf_metadata import GGUFFormatError, read_gguf_layout, read_gguf_metadata
from laps_agent.modelio.model_files import default_model_path
from laps_agent.modelio.tokenizer import TokenizerError, load_tokenizer


def library_metadata(path: Path) -> dict:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def write_every_type(path: Path, endianess=gguf.GGUFEndian.LITTLE) -> Path:
    writer = gguf.GGUFWriter(str(path), arch="llama", endianess=endianess)
    writer.add_uint8("t.u8", 255)
    writer.add_int8("t.i8", -128)
    writer.add_uint16("t.u16", 65535)
    writer.add_int16("t.i16", -32768)
    writer.add_uint32("t.u32", 4_000_000_000)
    writer.add_int32("t.i32", -2_000_000_000)
    writer.add_float32("t.f32", 0.1)   # not exact in float32: both readers must widen it alike
    writer.add_uint64("t.u64", 2**64 - 1)
    writer.add_int64("t.i64", -(2**63))
    writer.add_float64("t.f64", 1e300)
    writer.add_bool("t.yes", True)
    writer.add_bool("t.no", False)
    writer.add_string("t.text", "naïve ⏱ 日本 \n{{ template }}")
    writer.add_string("t.empty", "")
    writer.add_array("t.strings", ["a", "", "Ġthe", "<|im_end|>", "é"])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.none", [])
    writer.add_array("t.nested", [[1, 2], [3]])      # GGUFReader flattens arrays of arrays
    writer.add_array("t.nested_strings", [["x"], ["y", "z"]])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_shipped_model_reads_as_the_library_reads_it():
    path = default_model_path()
    mine = read_gguf_metadata(path)
    assert mine == library_metadata(path)
    assert len(mine["tokenizer.ggml.tokens"]) == len(mine["tokenizer.ggml.token_type"]) == 49152
    assert isinstance(mine["tokenizer.chat_template"], str)

    # The tensor table too: names, dims, GGML types and where each one's data starts.
    layout = read_gguf_layout(path)
    library = gguf.GGUFReader(str(path))
    assert layout.metadata == mine and layout.little_endian
    assert [(t.name, t.dims, t.ggml_type, t.offset) for t in layout.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset) for t in library.tensors]


def test_a_model_cut_inside_its_weights_or_of_the_other_byte_order_is_a_clear_error(tmp_path):
    from laps_agent.engine.model.loader import ModelLoadError, load_model

    whole = default_model_path().read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) - 1000])
    with pytest.raises(ModelLoadError, match=r"cut.gguf: tensor [a-z_.0-9]+ \(\w+\): the file ends inside its data"):
        load_model(cut)
    big = write_every_type(tmp_path / "big.gguf", gguf.GGUFEndian.BIG)
    with pytest.raises(ModelLoadError, match="big.gguf: a big-endian GGUF file is not supported"):
        load_model(big)


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG])
def test_every_value_type_reads_as_the_library_reads_it(tmp_path, endianess):
    path = write_every_type(tmp_path / "all.gguf", endianess)
    mine = read_gguf_metadata(path)
    assert mine == library_metadata(path)
    assert mine["t.u64"] == 2**64 - 1 and mine["t.yes"] is True and mine["t.strings"][2] == "Ġthe"
    assert mine["general.architecture"] == "llama" and mine["t.nested"] == [1, 2, 3]


def test_a_tokenizer_reads_its_own_keys_so_a_stray_byte_elsewhere_does_not_matter(tmp_path):
    path = tmp_path / "tok.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_string("general.description", "PLACEHOLDER")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_types([gguf.TokenType.NORMAL] * 3)
    writer.add_token_merges(["a b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # A description that is not UTF-8 (latin-1 bytes, as a careless converter might write).
    path.write_bytes(path.read_bytes().replace(b"PLACEHOLDER", b"caf\xe9 models"))
    with pytest.raises(GGUFFormatError, match="is not UTF-8"):
        read_gguf_metadata(path)
    assert load_tokenizer(path).encode("ab") == [2]


def test_a_cut_file_and_a_foreign_file_are_clear_errors(tmp_path):
    whole = write_every_type(tmp_path / "all.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(GGUFFormatError, match=r"truncated at byte \d+ \(the file has \d+\)"):
        read_gguf_metadata(cut)
    with pytest.raises(TokenizerError, match="truncated at byte"):
        load_tokenizer(cut)

    for name, content in (("empty.gguf", b""), ("notes.gguf", b"these are notes\n" * 8)):
        foreign = tmp_path / name
        foreign.write_bytes(content)
        with pytest.raises(TokenizerError, match="^GGUF magic invalid$"):
            load_tokenizer(foreign)

    v1 = tmp_path / "v1.gguf"
    v1.write_bytes(b"GGUF" + (1).to_bytes(4, "little") + bytes(16))
    with pytest.raises(TokenizerError, match=r"^GGUF version 1 is not supported \(only 2 and 3\)$"):
        load_tokenizer(v1)
    deep = tmp_path / "deep.gguf"   # an array of arrays of arrays ... : refused, not a RecursionError
    key = b"k"
    deep.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (0).to_bytes(8, "little") + (1).to_bytes(8, "little")
                     + len(key).to_bytes(8, "little") + key + (9).to_bytes(4, "little")
                     + ((9).to_bytes(4, "little") + (1).to_bytes(8, "little")) * 5000)
    with pytest.raises(GGUFFormatError, match="arrays nested deeper than 8"):
        read_gguf_metadata(deep)


def test_tensor_data_of_every_weight_type_and_any_alignment_reads_as_the_library_reads_it(tmp_path):
    """Where each tensor's data starts (general.alignment 64 here, not the default 32) and how
    its bytes are shaped for dequantisation: F32, F16, BF16 and Q8_0, non-square."""
    from gguf.quants import dequantize, quantize

    from laps_agent.engine.model.gguf_loader import _tensor_bytes, model_key

    rng = np.random.default_rng(0)
    weights = {"f32": (rng.standard_normal((3, 64)).astype(np.float32), gguf.GGMLQuantizationType.F32),
               "f16": (rng.standard_normal((5, 32)).astype(np.float16), gguf.GGMLQuantizationType.F16),
               "bf16": (rng.standard_normal((2, 96)).astype(np.float32), gguf.GGMLQuantizationType.BF16),
               "q8_0": (rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)}
    # The header's length varies with the name: over 8 lengths its end falls on every residue
    # modulo 64 that rounding up to 32 instead of 64 would get wrong.
    for pad in range(0, 64, 8):
        path = tmp_path / f"weights{pad}.gguf"
        writer = gguf.GGUFWriter(str(path), arch="llama")
        writer.add_custom_alignment(64)
        writer.add_string("general.name", "x" * pad)
        for name, (values, kind) in weights.items():
            if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
                writer.add_tensor(name, values)
            else:
                writer.add_tensor(name, quantize(values, kind), raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

        layout = read_gguf_layout(path, wanted=model_key)   # alignment is read though not wanted
        assert "general.alignment" not in layout.metadata
        library = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        data = np.memmap(path, dtype=np.uint8, mode="r")
        for tensor in layout.tensors:
            theirs = library[tensor.name]
            assert tensor.offset == theirs.data_offset and tensor.offset % 64 == 0
            kind = gguf.GGMLQuantizationType(tensor.ggml_type)
            mine = dequantize(_tensor_bytes(data, tensor.dims, kind, tensor.offset), kind)
            assert np.array_equal(mine, dequantize(theirs.data, theirs.tensor_type)), tensor.name
            assert mine.shape == weights[tensor.name][0].shape


def test_an_alignment_that_is_not_a_uint32_power_of_two_is_refused(tmp_path):
    for value, problem in ((48, "48 is not a power of two"), ("64", "must be a uint32")):
        path = tmp_path / "bad.gguf"
        writer = gguf.GGUFWriter(str(path), arch="llama")
        if isinstance(value, int):
            writer.add_uint32("general.alignment", value)
        else:
            writer.add_string("general.alignment", value)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with pytest.raises(GGUFFormatError, match=problem):
            read_gguf_layout(path)
