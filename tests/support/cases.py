"""The setups of the bad-input table (tests/support/bad_*_cases.py, run by tests/bake/test_bad_input.py):
each breaks one thing.

A setup gets a ``Ctx`` (its own copy of a tiny checkpoint, a default destination, a scratch folder),
breaks the source, the command line, a recipe, a findings file or the destination, and returns the
CLI arguments to run.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from surgery.core.checkpoint import Checkpoint
from tests.support import corrupt as bad


@dataclass
class Ctx:
    """What a case may use: its own source copy, a default destination, a scratch folder."""

    src: Path
    out: Path
    tmp: Path

    def heads(
        self,
        model: Path | str | None = None,
        spec: str = "0.1",
        alpha: str = "2.0",
        out: Path | None = None,
        *extra: str,
    ) -> list:
        return ["amplify-heads", model or self.src, "--heads", spec, "--alpha", alpha, "--out", out or self.out, *extra]

    def recipe(self, text: str, name: str = "recipe.yaml") -> list:
        path = self.tmp / name
        path.write_text(text)
        return ["apply", path, "--model", self.src, "--out", self.out]


@dataclass
class Case:
    id: str
    setup: Callable[[Ctx], list]
    needles: tuple[str, ...]  # (the problem, the fix): both must appear in the error line
    source: str = "single"
    dest_exists: bool = False  # the destination was there before: it must be left untouched


def no_config(c: Ctx) -> list:
    (c.src / "config.json").unlink()
    return c.heads()


def no_weights(c: Ctx) -> list:
    (c.src / bad.WEIGHTS).unlink()
    return c.heads()


def pickle(name: str) -> Callable[[Ctx], list]:
    def setup(c: Ctx) -> list:
        bad.pickle_weights(c.src, name, c.tmp / "UNPICKLED")
        return c.heads()

    return setup


def weights(change: Callable[..., None], *args) -> Callable[[Ctx], list]:
    def setup(c: Ctx) -> list:
        change(c.src / bad.WEIGHTS, *args)
        return c.heads()

    return setup


def config(**changes) -> Callable[[Ctx], list]:
    def setup(c: Ctx) -> list:
        bad.edit_config(c.src, **changes)
        return c.heads()

    return setup


def quant(method: str, key: str = "quantization_config") -> Callable[[Ctx], list]:
    return config(**{key: {"quant_method": method, "bits": 4}})


def repeated_config_key(c: Ctx) -> list:
    """config.json giving num_hidden_layers twice: which one holds depends on the reader."""
    path = c.src / "config.json"
    path.write_text(path.read_text().replace("{", '{\n  "num_hidden_layers": 2,', 1))
    return c.heads()


def repeated_index_entry(c: Ctx) -> list:
    """An index that maps one tensor to two shards."""
    path = c.src / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    name, shard = next(iter(index["weight_map"].items()))
    other = next(s for s in index["weight_map"].values() if s != shard)
    path.write_text(
        json.dumps(index, indent=1).replace('"weight_map": {', f'"weight_map": {{\n  "{name}": "{other}",', 1)
    )
    return c.heads()


def missing_shard(c: Ctx) -> list:
    (c.src / "model-00003-of-00007.safetensors").unlink()
    return c.heads()


def bad_index(c: Ctx) -> list:
    (c.src / "model.safetensors.index.json").write_text('{"metadata": {}}')
    return c.heads()


def weights_folder(c: Ctx) -> list:
    (c.src / bad.WEIGHTS).unlink()
    (c.src / bad.WEIGHTS).mkdir()
    return c.heads()


def dangling_weights(c: Ctx) -> list:
    """A Hub-cache snapshot whose blob is gone: the symlink points nowhere."""
    (c.src / bad.WEIGHTS).unlink()
    (c.src / bad.WEIGHTS).symlink_to(c.tmp / "blobs" / "missing")
    return c.heads()


def index_to(shard: str) -> Callable[[Ctx], list]:
    """An index that sends every tensor to ``shard`` (moved there when it is inside the folder)."""

    def setup(c: Ctx) -> list:
        names = bad.tensor_names(bad.read_raw(c.src / bad.WEIGHTS)[0])
        target = (c.src / shard).resolve()
        target.parent.mkdir(parents=True, exist_ok=True)
        (c.src / bad.WEIGHTS).rename(target)
        (c.src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
        return c.heads()

    return setup


def dest_symlink(c: Ctx) -> list:
    c.out.parent.mkdir(exist_ok=True)
    c.out.symlink_to(c.src)
    return c.heads()


def dest_exists(c: Ctx) -> list:
    c.out.mkdir(parents=True)
    (c.out / "keep.txt").write_text("precious")
    return c.heads()


def dest_is_file(c: Ctx) -> list:
    c.out.parent.mkdir(exist_ok=True)
    c.out.write_text("precious")
    return c.heads(None, "0.1", "2.0", None, "--force")


def not_baked(c: Ctx) -> list:
    return ["verify", c.src, c.src, "--structural-only"]


def swapped_verify(c: Ctx) -> list:
    """``verify BAKED SOURCE``: the bake given first."""
    from surgery.bake.bake import bake
    from surgery.core.edits import HeadScale, Recipe

    bake(Checkpoint(c.src), Recipe((HeadScale(0, 1, 2.0),)), c.tmp / "baked")
    return ["verify", c.tmp / "baked", c.src, "--structural-only"]


def undo_not_baked(c: Ctx) -> list:
    return ["undo", c.src, "--out", c.out]


def sweep_folder(command: Callable[[Ctx, Path], list]) -> Callable[[Ctx], list]:
    """``command`` given a sweep's folder (two α, one baked folder each) instead of a baked folder."""

    def setup(c: Ctx) -> list:
        from surgery.bake.bake import bake
        from surgery.core.edits import HeadScale, Recipe

        (c.tmp / "sweep").mkdir()
        for alpha in (2.0, 3.0):
            bake(Checkpoint(c.src), Recipe((HeadScale(0, 1, alpha),)), c.tmp / "sweep" / f"alpha-{alpha:g}")
        return command(c, c.tmp / "sweep")

    return setup


def undo_changed_bake(change: Callable[[Path], None]) -> Callable[[Ctx], list]:
    """``surgery undo`` of a baked folder that ``change`` altered after the bake (a file added or removed)."""

    def setup(c: Ctx) -> list:
        from surgery.bake.bake import bake
        from surgery.core.edits import HeadScale, Recipe

        bake(Checkpoint(c.src), Recipe((HeadScale(0, 1, 2.0),)), c.tmp / "baked")
        change(c.tmp / "baked")
        return ["undo", c.tmp / "baked", "--out", c.out]

    return setup


def adapter_folder(command: Callable[[Ctx, Path], list]) -> Callable[[Ctx], list]:
    """``command`` given an adapter folder that export-lora wrote instead of a baked folder."""

    def setup(c: Ctx) -> list:
        from surgery.bake.lora import export_lora
        from surgery.core.edits import HeadScale, Recipe

        export_lora(Checkpoint(c.src), Recipe((HeadScale(0, 1, 2.0),)), c.tmp / "adapter")
        return command(c, c.tmp / "adapter")

    return setup


def empty_tokenizer() -> Callable[[Ctx], list]:
    """A tokenizer whose vocabulary holds no character of the check prompts (and no <unk>): every
    prompt encodes to zero tokens; ``surgery verify`` runs on a bake of that model (the bake's own
    check runs no tokenizer)."""

    def setup(c: Ctx) -> list:
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast

        core = Tokenizer(models.BPE(vocab={"<pad>": 0, "<s>": 1, "</s>": 2, "~": 3}, merges=[]))
        PreTrainedTokenizerFast(
            tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>"
        ).save_pretrained(c.src)
        from surgery.bake.bake import bake
        from surgery.core.edits import HeadScale, Recipe

        baked = c.tmp / "baked-before"
        bake(Checkpoint(c.src), Recipe((HeadScale(0, 1, 2.0),)), baked)
        return ["verify", c.src, baked]

    return setup


def findings(text_or_change) -> Callable[[Ctx], list]:
    """A heads findings file given to amplify-heads: raw text, or a change to a valid one."""

    def setup(c: Ctx) -> list:
        from surgery.find.findings import model_identity

        path = c.tmp / "findings.json"
        if isinstance(text_or_change, str):
            path.write_text(text_or_change)
        else:
            doc = {
                "format": "surgery-findings",
                "version": 1,
                "kind": "heads",
                "model": model_identity(Checkpoint(c.src)),
                "discovery": {"heads": [{"layer": 0, "head": 1}]},
                "selected_heads": [[0, 1]],
            }
            text_or_change(doc)
            path.write_text(json.dumps(doc))
        return ["amplify-heads", c.src, "--findings", path, "--alpha", "2", "--out", c.out, "--top", "1"]

    return setup


def other_model(same_architecture: bool, model_type: str = "qwen2") -> Callable[[dict], None]:
    def change(doc: dict) -> None:
        doc["model"].update(fingerprint="0" * 64, path="/models/other")
        if not same_architecture:
            doc["model"].update(model_type=model_type, geometry={**doc["model"]["geometry"], "num_layers": 24})

    return change


def top(n: str) -> Callable[[Ctx], list]:
    def setup(c: Ctx) -> list:
        args = findings(lambda doc: None)(c)
        return args[:-1] + [n]

    return setup


def neuron_findings(*options: str, change: Callable[[dict], None] = lambda doc: None) -> Callable[[Ctx], list]:
    """prune-neurons --findings with a small valid neurons findings file (3 layers × 48 neurons)."""

    def setup(c: Ctx) -> list:
        from surgery.find.findings import model_identity

        doc = {
            "format": "surgery-findings",
            "version": 1,
            "kind": "neurons",
            "model": model_identity(Checkpoint(c.src)),
            "scores": _neuron_scores(3, 48),
        }
        change(doc)
        path = c.tmp / "neurons.json"
        path.write_text(json.dumps(doc))
        return ["prune-neurons", c.src, "--findings", path, *options, "--out", c.out]

    return setup


def _neuron_scores(layers: int, width: int) -> dict:
    """Scores in the findings format, made by surgery's own NeuronScores (whatever arrays it holds)."""
    import dataclasses

    import numpy as np

    from surgery.find.neurons.scores import NeuronScores

    grid = (np.arange(layers * width).reshape(layers, width) % 7 + 1) / 8
    values = {
        f.name: {"Gender": 4} if f.name == "counts" else grid if f.name == "ppm" else {"Gender": grid}
        for f in dataclasses.fields(NeuronScores)
        if f.default is dataclasses.MISSING
    }  # dense: no MoE fields
    return NeuronScores(**values).to_dict()


def direction(
    values=None, entry: str = "layer: 0, module: attention, weight: 1.0", vector: str = "v.safetensors#r"
) -> Callable[[Ctx], list]:
    """A recipe with one direction edit ``entry`` whose vector ``r`` is ``values`` (default: a random
    direction of the tiny models' hidden size 32), saved next to the recipe as v.safetensors."""

    def setup(c: Ctx) -> list:
        import numpy as np
        from safetensors.numpy import save_file

        v = np.random.default_rng(0).standard_normal(32).astype(np.float32) if values is None else values
        save_file({"r": np.asarray(v)}, c.tmp / "v.safetensors")
        return c.recipe(f"version: 1\nedits:\n  - {{type: direction, {entry}, vector: {vector}}}\n")

    return setup
