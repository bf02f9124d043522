"""A Python caller's slips are one line naming the parameter, not a traceback from deep inside:
an object where a path belongs (a loaded model, a recipe in the model's place), a dict or a bare
switch where a typed object belongs, a string where a list belongs. And a ``~`` path works in
every parameter that takes a file or folder, as a shell would expand it on the command line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import surgery
from surgery.core.errors import ParameterError

RECIPE = "version: 1\nedits:\n  - {type: head, layer: 0, head: 1, alpha: 2.0}\n"


class LlamaForCausalLM:
    """Stands for a model loaded with transformers (what a user may hold instead of its folder)."""

    def save_pretrained(self, folder: str) -> None:
        raise AssertionError("surgery must not call it")


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda out: surgery.inspect(LlamaForCausalLM()), "model"),
        (lambda out: surgery.amplify_heads(LlamaForCausalLM(), out, alpha=2, heads=[(0, 1)]), "model"),
        (lambda out: surgery.find_neurons(LlamaForCausalLM()), "model"),
        (lambda out: surgery.verify(LlamaForCausalLM(), out), "source"),
        (lambda out: surgery.export_lora(LlamaForCausalLM(), surgery.Recipe(()), out), "model"),
    ],
    ids=["inspect", "amplify_heads", "find_neurons", "verify", "export_lora"],
)
def test_a_loaded_model_where_its_folder_belongs_is_named(call, name, tmp_path):
    with pytest.raises(ParameterError) as raised:
        call(tmp_path / "out")
    message = str(raised.value)
    assert message.startswith(f"{name} must be a checkpoint folder") and "LlamaForCausalLM" in message
    assert "save_pretrained(DIR)" in message and "\n" not in message
    assert not (tmp_path / "out").exists()


def test_recipe_and_model_swapped_names_the_model(tiny, tmp_path):
    """apply(model, recipe, out): the recipe is where the model belongs."""
    with pytest.raises(ParameterError, match=r"^model must be .* got an object of type Recipe$"):
        surgery.apply(tiny("llama"), surgery.Recipe(()), tmp_path / "out")


@pytest.mark.parametrize(
    "keyword, given, shown",
    [
        ("load", {"device": "cpu"}, "surgery.LoadSpec(device='cpu')"),
        ("bake", True, "surgery.BakeOptions(…)"),
        ("select", "global", "surgery.SelectParams(…)"),
    ],
)
def test_a_typed_object_of_another_type_is_one_line(keyword, given, shown, tiny, tmp_path):
    """Was an AttributeError ('dict' object has no attribute 'revision') from the code using it."""
    with pytest.raises(ParameterError, match="belongs; write ") as raised:
        surgery.prune_neurons(tiny("llama"), tmp_path / "out", n=3, **{keyword: given})
    assert str(raised.value).endswith(shown)


def test_n_as_a_string_is_named_whole(tiny, tmp_path):
    """n="20" was read letter by letter and refused as "got 2"."""
    with pytest.raises(ParameterError, match=r"^n must be whole numbers ≥ 1, got '20'$"):
        surgery.prune_neurons(tiny("llama"), tmp_path / "out", n="20")


def test_an_unknown_option_of_apply_is_named_as_apply_s(tiny, tmp_path):
    with pytest.raises(TypeError, match=r"^apply\(\) got unknown option forse;"):
        surgery.apply(surgery.Recipe(()), tiny("llama"), tmp_path / "out", forse=True)


def test_tilde_paths_work_in_every_file_parameter(tiny, tmp_path, monkeypatch):
    """The docs write models as "~/.cache/…"; the baked folder, the recipe file, the findings and
    the card's folder given the same way were "does not exist" (only the model was expanded)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    model = tiny("llama")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    baked = surgery.apply("~/recipe.yaml", model, tmp_path / "baked")
    assert [e.layer for e in baked.provenance.recipe.edits] == [0]
    assert surgery.verify(model, "~/baked", structural_only=True).ok
    assert surgery.write_card("~/baked") == tmp_path / "baked" / "README.md"
    hashes = surgery.undo("~/baked", tmp_path / "restored")
    assert {n: (tmp_path / "restored" / n).read_bytes() for n in hashes} == {
        n: (model / n).read_bytes() for n in hashes
    }
    surgery.export_lora(model, "~/recipe.yaml", tmp_path / "lora")
    assert (tmp_path / "lora" / "adapter_config.json").is_file()


def test_one_findings_path_is_one_file_not_its_letters(tmp_path):
    """report("f.json", out) iterated the string and said "/ is a folder"."""
    missing = tmp_path / "nope.json"
    with pytest.raises(surgery.SurgeryError) as raised:
        surgery.report(str(missing), tmp_path / "report")
    assert str(raised.value).startswith(str(missing))


def test_a_path_parameter_given_no_path_is_named(tmp_path):
    with pytest.raises(ParameterError, match=r"^baked must be a path \(a str or pathlib.Path\), got None$"):
        surgery.undo(None, tmp_path / "restored")
    with pytest.raises(ParameterError, match=r"^findings must be paths .* got an object of type int$"):
        surgery.report(3, tmp_path / "report")


def test_paths_given_as_path_objects_still_work(tiny, tmp_path):
    model = tiny("llama")
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    surgery.apply(Path(tmp_path / "recipe.yaml"), Path(model), tmp_path / "baked")
    assert surgery.inspect(Path(model)).layers == surgery.inspect(str(model)).layers


def test_tilde_findings_file_is_read(tmp_path, monkeypatch):
    """A findings file given as "~/…" (FindingsSource, --findings) was "does not exist"."""
    from surgery.core.errors import FindingsError
    from surgery.find.findings import load_findings

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "f.json").write_text("{}")
    with pytest.raises(FindingsError) as raised:  # read (and refused as no findings), not missing
        load_findings("~/f.json", "neurons")
    assert "does not exist" not in str(raised.value)


def test_choosing_options_beside_named_neurons_are_refused(tiny, tmp_path, capsys):
    """score / rule beside neurons were ignored on the command line without a word, and in Python
    called score an unknown option (prune_neurons takes it, with n)."""
    from tests.support.cli import main_output

    model = tiny("llama")
    with pytest.raises(ParameterError, match=r"^neurons names the neurons itself; score chooses neurons from"):
        surgery.prune_neurons(model, tmp_path / "py", neurons=[(0, 1)], score="bias")
    code, _, err = main_output(
        capsys,
        "prune-neurons",
        model,
        "--neurons",
        "0:1",
        "--score",
        "bias",
        "--select",
        "global",
        "--out",
        tmp_path / "cli",
    )
    assert code != 0 and "--neurons names the neurons itself; --select, --score choose neurons" in err
    assert not (tmp_path / "py").exists() and not (tmp_path / "cli").exists()


@pytest.mark.parametrize(
    "edits, said",
    [
        (surgery.HeadScale(layer=0, head=1, alpha=2.0), "Recipe's edits must be a sequence of edits, got HeadScale"),
        (((0, 1, 2.0),), "edits[0] is a tuple, not an edit"),
        (({"type": "head", "layer": 0, "head": 1, "alpha": 2.0},), "edits[0] is a dict, not an edit"),
    ],
    ids=["bare-edit", "tuple", "dict"],
)
def test_a_recipe_of_no_edits_is_one_line(edits, said):
    """Were "'HeadScale' object is not iterable" and "'tuple' object has no attribute 'target'"."""
    with pytest.raises(surgery.RecipeError, match=re.escape(said)):
        surgery.Recipe(edits)


def test_a_missing_findings_file_of_report_is_missing(tmp_path):
    """Was "is not a readable findings JSON file" (the file is not there at all)."""
    with pytest.raises(surgery.SurgeryError, match=r"nope.json does not exist; give a findings JSON"):
        surgery.report([tmp_path / "nope.json"], tmp_path / "report")


def test_an_alpha_given_as_text_is_quoted(tiny, tmp_path):
    with pytest.raises(ParameterError, match=r"^alpha must be a finite number, got '2'$"):
        surgery.amplify_heads(tiny("llama"), tmp_path / "out", alpha=["2", "3"], heads=[(0, 1)])


def test_neuron_findings_select_defaults_to_prune_neurons_choice(tiny, tmp_path):
    """findings.select(5) (the guide's `.select(n, …)`) was "missing 1 required positional argument"."""
    from tests.support.neuron_pairs import write_pairs
    from tests.support.tokenizer import save_char_tokenizer

    model = tiny("llama")
    save_char_tokenizer(model, bos=True)
    found = surgery.find_neurons(model, pairs=str(write_pairs(tmp_path / "pairs.jsonl")))
    assert found.select(3) == found.select(3, surgery.SelectParams())
    assert len(found.select(3).neurons) == 3


def test_a_tilde_out_file_is_written_where_it_was_checked(tiny, tmp_path, monkeypatch):
    """find_neurons(out="~/f.json") checked ~/f.json but wrote ./~/f.json (a folder named "~")."""
    from tests.support.neuron_pairs import write_pairs
    from tests.support.tokenizer import save_char_tokenizer

    model = tiny("llama")
    save_char_tokenizer(model, bos=True)
    pairs = write_pairs(tmp_path / "pairs.jsonl")
    (tmp_path / "home").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path / "work")
    surgery.find_neurons(model, pairs=str(pairs), out="~/findings.json")
    assert (tmp_path / "home" / "findings.json").is_file() and not (tmp_path / "work" / "~").exists()


DIRECTION_MODEL = Path(__file__).parents[1] / "fixtures" / "direction_model"


@pytest.mark.parametrize("find", [surgery.find_direction, surgery.find_heads, surgery.find_neurons])
def test_an_unknown_option_of_a_finder_is_named_as_its_own(find, tmp_path):
    """find_direction(…, layers=…) named direction_findings() (find_heads: head_findings() …)."""
    name = find.__name__
    with pytest.raises(TypeError, match=rf"^{name}\(\) got unknown option layerz;"):
        find(tmp_path / "absent", layerz="1")


def test_prompts_given_as_a_list_are_one_line(tmp_path):
    """a=["…"] was Python's "expected str, bytes or os.PathLike object, not list"."""
    with pytest.raises(ParameterError, match=r"^a must be a prompts file .* got an object of type list; write"):
        surgery.find_direction(DIRECTION_MODEL, a=["hola"], b=DIRECTION_MODEL / "b.txt", device="cpu")


def test_ablate_direction_takes_what_find_direction_returned(tmp_path):
    """direction=find_direction(…) was a TypeError; direction=None said "give both a and b"."""
    found = surgery.find_direction(DIRECTION_MODEL, a=DIRECTION_MODEL / "a.txt", b=DIRECTION_MODEL / "b.txt")
    with pytest.raises(ParameterError, match=r"^direction must be a path \(a str or pathlib.Path\), got None$"):
        surgery.ablate_direction(DIRECTION_MODEL, tmp_path / "none", direction=None)
    baked = surgery.ablate_direction(DIRECTION_MODEL, tmp_path / "out", direction=found, layers="1")
    assert {e.layer for e in baked.provenance.recipe.edits} == {1}
    assert not (tmp_path / "none").exists()
    # the bakes choosing from findings take them the same way (amplify_heads(findings=find_heads(…)))
    assert surgery.FindingsSource(findings=found).findings == found.path
    with pytest.raises(ParameterError, match=r"^findings must be a path .* got an object of type int$"):
        surgery.FindingsSource(findings=3)


def test_an_expert_neuron_as_a_triple_is_shown_its_label(tiny, tmp_path):
    """(layer, expert, neuron) was refused with dense examples only."""
    with pytest.raises(ParameterError, match=r"an expert's neuron as '3:e5:17' \(shared: '3:s:17'\)$"):
        surgery.prune_neurons(tiny("qwen2_moe"), tmp_path / "out", neurons=[(1, 2, 5)])
