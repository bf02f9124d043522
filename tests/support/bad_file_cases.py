"""Bad input of tests/bake/test_bad_input.py, part two: recipe files, direction edits, findings files,
destinations, verify / undo on what is not a bake, and a tokenizer that encodes the check's prompts to nothing."""

from __future__ import annotations

import numpy as np

from tests.support import cases as setups
from tests.support.cases import Case

RECIPE_OK_EDIT = "  - {type: head, layer: 0, head: 1, alpha: 2.0}\n"


def _file(path, data: bytes):
    path.write_bytes(data)
    return path


FILE_CASES = [
    # --- recipe files ---
    Case(
        "recipe-missing",
        lambda c: ["apply", c.tmp / "none.yaml", "--model", c.src, "--out", c.out],
        ("does not exist", "give the path of a recipe"),
    ),
    # a folder (e.g. a baked one) is not missing: the error says what it is
    Case(
        "recipe-a-folder",
        lambda c: ["apply", c.src, "--model", c.src, "--out", c.out],
        ("is a folder", "give the path of a recipe YAML file", "surgery.json"),
    ),
    Case("recipe-empty", lambda c: c.recipe(""), ("is empty", "needs 'version' and 'edits'")),
    Case("recipe-not-yaml", lambda c: c.recipe("version: [1\nedits: {"), ("not valid YAML", "fix the syntax")),
    # two recipes pasted into one file: YAML keeps the second's keys, so the first one's edits were lost
    Case(
        "recipe-two-in-one-file",
        lambda c: c.recipe(
            "version: 1\nedits:\n" + RECIPE_OK_EDIT + "version: 1\nedits:\n"
            "  - {type: head, layer: 0, head: 2, alpha: 3.0}\n"
        ),
        ("key 'version' appears twice in one mapping (lines 1 and 4)", "keep one"),
    ),
    Case(
        "recipe-repeats-alpha",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2, alpha: 3}\n"),
        ("key 'alpha' appears twice on line 3", "keep one"),
    ),
    Case("recipe-a-list", lambda c: c.recipe("- 1\n- 2\n"), ("must be a YAML mapping", "'version' and 'edits'")),
    Case(
        "recipe-wrong-version",
        lambda c: c.recipe("version: 9\nedits:\n" + RECIPE_OK_EDIT),
        ("version must be 1", "got 9"),
    ),
    Case(
        "recipe-without-version",
        lambda c: c.recipe("edits:\n" + RECIPE_OK_EDIT),
        ("recipe.yaml has no version", "add 'version: 1'"),
    ),
    Case(
        "recipe-unknown-key",
        lambda c: c.recipe("version: 1\nalpha: 2\nedits:\n" + RECIPE_OK_EDIT),
        ("unknown key alpha", "allowed:"),
    ),
    Case(
        "recipe-no-edits",
        lambda c: c.recipe("version: 1\nedits: []\n"),
        ("edits must be a non-empty list", "(direction, head, neuron, steer)"),
    ),
    Case(
        "recipe-alpha-string",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: big}\n"),
        ("alpha must be a number", "'big'"),
    ),
    Case(
        "recipe-alpha-nan",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: .nan}\n"),
        ("alpha must be a finite number", "nan"),
    ),
    # YAML 1.1 would read these as other numbers (010 → 8, 1:30 → 90): refused, saying why (issue 33)
    Case(
        "recipe-neuron-octal",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: neuron, layer: 0, neuron: 010, factor: 0}\n"),
        ("edits[0].neuron = '010' is not a plain decimal number", "octal in YAML 1.1 (8)", "drop the leading zeros"),
    ),
    Case(  # a recipe's own spelling, not only --neurons' 1:eE:5
        "recipe-neuron-expert-not-named",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: neuron, layer: 1, neuron: 5, factor: 0}\n"),
        ("layer 1 is a mixture of experts", "1:eE:5 or a recipe's `expert: E`", "`expert: shared`"),
        source="qwen2_moe",
    ),
    Case(
        "recipe-neuron-base-60",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: neuron, layer: 0, neuron: 1:30, factor: 0}\n"),
        ("edits[0].neuron = '1:30'", "base 60 (90)", "write one decimal number"),
    ),
    Case(
        "recipe-layer-hex",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0x1, head: 1, alpha: 2}\n"),
        ("edits[0].layer = '0x1'", "write it in decimal (1)"),
    ),
    Case(
        "recipe-head-underscore",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1_0, alpha: 2}\n"),
        ("edits[0].head = '1_0'", "drops underscores (10)", "leave them out"),
    ),
    Case(
        "recipe-alpha-yes",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: yes}\n"),
        ("edits[0].alpha = 'yes'", "a boolean (True)"),
    ),
    Case(
        "recipe-layer-true",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: true, head: 1, alpha: 2}\n"),
        ("edits[0].layer must be a number, got True (a boolean)",),
    ),
    Case(
        "recipe-alpha-nan-word",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: nan}\n"),
        ("alpha must be a finite number, got 'nan'", "NaN or infinite scale"),
    ),
    Case(
        "recipe-alpha-inf",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: -.inf}\n"),
        ("alpha must be a finite number, got -inf", "NaN or infinite scale"),
    ),
    # 1e30 is a number (YAML 1.1 read it as text, "must be a number, got '1e30'"): the bake says why not
    Case(
        "recipe-alpha-1e30",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 1e30}\n"),
        ("alpha 1e+30 scales the weights of head 0.1 up to", "choose a smaller scale"),
    ),
    Case(
        "recipe-conflict",
        lambda c: c.recipe(
            "version: 1\nedits:\n" + RECIPE_OK_EDIT + "  - {type: head, layer: 0, head: 1, alpha: 3.0}\n"
        ),
        ("conflicting edits", "keep one"),
    ),
    Case(
        "recipe-head-out-of-range",
        lambda c: c.recipe("version: 1\nedits:\n  - {type: head, layer: 0, head: 9, alpha: 2}\n"),
        ("num_attention_heads = 4", "valid: 0..3"),
    ),
    # --- direction edits: the vector, the module, the weight ---
    Case("direction-zero-norm", setups.direction(np.zeros(32, np.float32)), ("has norm 0", "give a non-zero vector")),
    Case(
        "direction-wrong-size",
        setups.direction(np.ones(31, np.float32)),
        ("has 31 values but the model has hidden_size = 32", "give a direction of the model's residual stream"),
    ),
    Case(
        "direction-nan",
        setups.direction(np.full(32, np.nan, np.float32)),
        ("holds NaN or inf", "give a finite direction"),
    ),
    Case("direction-not-1d", setups.direction(np.ones((4, 8), np.float32)), ("shape [4, 8]", "a direction is a 1-D")),
    Case(
        "direction-file-missing",
        setups.direction(vector="none.safetensors#r"),
        ("none.safetensors does not exist", "relative to the recipe's folder"),
    ),
    Case("direction-name-missing", setups.direction(vector="v.safetensors#q"), ("has no tensor 'q' (it has: r)",)),
    Case("direction-spec-malformed", setups.direction(vector="v.safetensors"), ("must be FILE.safetensors#NAME",)),
    Case(
        "direction-sha256-pinned",
        setups.direction(entry=f"layer: 0, module: attention, weight: 1.0, sha256: '{'0' * 64}'"),
        ("the recipe pins 000000000000", "restore it or drop 'sha256'"),
    ),
    Case(
        "direction-unknown-module",
        setups.direction(entry="layer: 0, module: residual, weight: 1.0"),
        ("module must be one of attention, mixer, mlp, experts, shared_experts, embeddings", "'residual'"),
    ),
    Case(
        "direction-layer-out-of-range",
        setups.direction(entry="layer: 3, module: mlp, weight: 1.0"),
        ("num_hidden_layers = 3", "valid: 0..2"),
    ),
    Case(
        "direction-mlp-of-moe-layer",
        setups.direction(entry="layer: 0, module: mlp, weight: 1.0"),
        ("layer 0 is a mixture of experts", "use experts, shared_experts"),
        source="qwen2_moe",
    ),
    Case(
        "direction-experts-of-dense-layer",
        setups.direction(entry="layer: 0, module: experts, weight: 1.0"),
        ("layer 0 of llama is a dense MLP (no experts)", "use mlp"),
    ),
    Case(
        "direction-no-shared-expert",
        setups.direction(entry="layer: 0, module: shared_experts, weight: 1.0"),
        ("gpt_oss has no shared expert", "use experts"),
        source="gpt_oss",
    ),
    Case(
        "direction-weight-inf",
        setups.direction(entry="layer: 0, module: attention, weight: .inf"),
        ("weight must be a finite number", "inf"),
    ),
    Case(
        "direction-weight-overflows-bf16",
        setups.direction(entry="layer: 0, module: mlp, weight: 1.0e+38"),
        (
            "direction edit of 'model.layers.0.mlp.down_proj.bias' makes some of its weights 1.7e+35, past 2^64",
            "choose a smaller weight",
        ),
        source="bf16",
    ),
    # --- findings files ---
    Case(
        "findings-missing",
        lambda c: ["amplify-heads", c.src, "--findings", c.tmp / "none.json", "--alpha", "2", "--out", c.out],
        ("does not exist", "surgery find-heads"),
    ),
    Case("findings-empty", setups.findings(""), ("not valid JSON", "recompute it with surgery find-heads")),
    Case(
        "findings-truncated",
        setups.findings('{"format": "surgery-findings", "versi'),
        ("not valid JSON", "recompute it with surgery find-heads"),
    ),
    Case(
        "findings-repeat-a-key",
        setups.findings('{"format": "surgery-findings",\n "format": "surgery-findings"}'),
        ("key 'format' appears twice in one mapping (lines 1 and 2)", "recompute it with surgery find-heads"),
    ),
    Case(
        "findings-not-surgery", setups.findings('{"scores": []}'), ("not a surgery findings file", "surgery find-heads")
    ),
    Case("findings-wrong-version", setups.findings(lambda d: d.update(version=7)), ("findings version 7", "recompute")),
    Case(
        "findings-of-neurons",
        setups.findings(lambda d: d.update(kind="neurons")),
        ("holds 'neurons' findings", "surgery find-heads"),
    ),
    Case(
        "findings-without-model", setups.findings(lambda d: d.pop("model")), ("does not record the model", "recompute")
    ),
    Case("findings-other-model-same-arch", setups.findings(setups.other_model(True)), ("another model", "--transfer")),
    Case(
        "findings-other-architecture",
        setups.findings(setups.other_model(False)),
        ("different model", "architecture differs (model_type qwen2 there, llama here; num_layers 24 there, 3 here)"),
    ),
    # --transfer applies findings to the same architecture only: the refusal says which field differs
    Case(
        "findings-other-geometry-transfer",
        lambda c: setups.findings(setups.other_model(False, model_type="llama"))(c) + ["--transfer"],
        ("even with --transfer", "differs (num_layers 24 there, 3 here)", "compute findings for this model"),
    ),
    Case("findings-top-too-large", setups.top("5"), ("--top 5 but the findings rank only 1", "choose a smaller --top")),
    Case(
        "n-larger-than-the-model",
        setups.neuron_findings("--n", "1000"),
        ("--n 1000 is out of range: the model has", "choose 1.."),
    ),
    Case(
        "n-larger-than-one-layer",
        setups.neuron_findings("--n", "49", "--layers", "1"),
        ("--n 49 is out of range: these layers hold", "choose 1.."),
    ),
    Case("n-zero", setups.neuron_findings("--n", "0"), ("--n must be whole numbers ≥ 1", "got 0")),
    Case(
        "neuron-findings-bad-scores",
        setups.neuron_findings("--n", "5", change=lambda d: d["scores"].update(width=64)),
        ("do not match their layers × width", "recompute them with surgery find-neurons"),
    ),
    Case(
        "neuron-findings-are-heads",
        setups.neuron_findings("--n", "5", change=lambda d: d.update(kind="heads")),
        ("holds 'heads' findings", "surgery find-neurons"),
    ),
    # --- destinations ---
    Case("dest-is-source", lambda c: c.heads(None, "0.1", "2.0", c.src), ("is the source", "choose a folder outside")),
    Case("dest-inside-source", lambda c: c.heads(None, "0.1", "2.0", c.src / "out"), ("inside the source", "choose")),
    Case("dest-symlink-to-source", setups.dest_symlink, ("is the source", "choose a folder outside"), dest_exists=True),
    Case(
        "dest-contains-source",
        lambda c: c.heads(None, "0.1", "2.0", c.src.parent, "--force"),
        ("contains the source", "choose another folder"),
    ),
    Case("dest-exists", setups.dest_exists, ("already exists", "--force"), dest_exists=True),
    Case("dest-is-a-file", setups.dest_is_file, ("is not a folder", "remove it or choose another"), dest_exists=True),
    Case(
        "dest-parent-missing",
        lambda c: c.heads(None, "0.1", "2.0", c.tmp / "no" / "such" / "out"),
        ("does not exist", "create"),
    ),
    # --- verify / undo on something that is not a bake ---
    Case("verify-not-baked", setups.not_baked, ("no surgery.json", "give the folder that a surgery bake wrote")),
    Case(
        "verify-swapped",
        setups.swapped_verify,
        ("was made by surgery", "the source comes first: surgery verify SOURCE BAKED"),
    ),
    Case("undo-not-baked", setups.undo_not_baked, ("no surgery.json", "give the folder that a surgery bake wrote")),
    Case(  # a typo'd path: not "has no surgery.json", which sends the user looking into a folder that is not there
        "undo-missing",
        lambda c: ["undo", c.tmp / "nope", "--out", c.out],
        ("nope does not exist", "a surgery bake wrote"),
    ),
    # … on surgery's own other outputs: named as what they are, not "not made by surgery"
    Case(
        "verify-a-sweep",
        setups.sweep_folder(lambda c, f: ["verify", c.src, f, "--structural-only"]),
        ("is a sweep made by surgery, one baked folder per value (alpha-2, alpha-3)", "give one of them"),
    ),
    Case(
        "card-a-sweep",
        setups.sweep_folder(lambda c, f: ["card", f]),
        ("is a sweep made by surgery", "give one of them"),
    ),
    Case(  # was "has no config.json" (card, verify, undo already named the sweep)
        "eval-a-sweep",
        setups.sweep_folder(lambda c, f: ["eval", f, "--against", c.src, "--limit", "1"]),
        ("is a sweep made by surgery, one baked folder per value (alpha-2, alpha-3)", "give one of them"),
    ),
    Case(
        "eval-against-a-sweep",
        setups.sweep_folder(lambda c, f: ["eval", c.src, "--against", f, "--limit", "1"]),
        ("is a sweep made by surgery", "give one of them"),
    ),
    Case(  # was "undo did not reproduce the source (notes.txt differs)"
        "undo-a-file-added",
        setups.undo_changed_bake(lambda f: (f / "notes.txt").write_text("mine")),
        ("notes.txt was added after the bake (not in surgery.json)", "move it out of"),
    ),
    Case(  # was a bare "No such file or directory"
        "undo-a-file-removed",
        setups.undo_changed_bake(lambda f: (f / "config.json").unlink()),
        ("config.json is recorded in surgery.json but missing", "put it back"),
    ),
    Case(
        "undo-a-sweep",
        setups.sweep_folder(lambda c, f: ["undo", f, "--out", c.out]),
        ("is a sweep made by surgery", "give one of them"),
    ),
    Case(
        "verify-an-adapter",
        setups.adapter_folder(lambda c, f: ["verify", c.src, f, "--structural-only"]),
        ("is a LoRA adapter written by surgery export-lora", "give a folder that a bake wrote"),
    ),
    Case(
        "card-an-adapter",
        setups.adapter_folder(lambda c, f: ["card", f]),
        ("is a LoRA adapter written by surgery export-lora", "give a folder that a bake wrote"),
    ),
    Case(
        "export-lora-from-an-adapter",
        setups.adapter_folder(lambda c, f: ["export-lora", c.src, "--recipe", f, "--out", c.out]),
        ("is a LoRA adapter written by surgery export-lora", "give a folder that a bake wrote"),
    ),
    Case(  # read as YAML it was "not valid YAML: fix the syntax"
        "export-lora-from-a-baked-gguf",
        lambda c: ["export-lora", c.src, "--recipe", _file(c.tmp / "baked.gguf", b"GGUF\x03"), "--out", c.out],
        ("is a baked GGUF", 'write the sidecar\'s "recipe" to a YAML file'),
    ),
    # --- a tokenizer that encodes the logit check's prompts to nothing ---
    Case(
        "tokenizer-encodes-nothing-verify",
        setups.empty_tokenizer(),
        ("encodes the check prompt 'The capital of France is' to no tokens", "--structural-only"),
    ),
]
