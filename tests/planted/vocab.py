"""A word-level tokenizer for the binding task, saved with the model so AutoTokenizer loads it.

Every word is one token, the invented item and identity names included (so binding can happen as
early as layer 0; with names split into syllables, the trained model moved the item's syllables to
the identity by value and bound them later, through MLPs — a circuit attention patterns cannot
show). Words split on whitespace and every punctuation character stands alone, so ``(a)`` is the three
tokens ``(``, ``a``, ``)`` and the bare letters ``a``/``b``/``c`` (and ``A``/``B``/``C``) are
tokens: S is computed from their log-probabilities. Offsets are exact, which the option- and
item-span lookups need. Every word the prompts can contain is in the vocabulary, so nothing maps
to ``<unk>`` (an unknown spelling of a letter would otherwise alias all three options to one id).

The two fixed sentences every prompt ends with (the answering instruction and the answer prefix
of surgery.core.mcq) are single tokens: they carry no information, and as ~55 word tokens they
would more than double the cost of training on this CPU.
"""

from __future__ import annotations

from collections.abc import Iterable

from tests.planted.task import EQUAL, KNOWLEDGE, World, identity_text, templates

SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")


def _pre_tokenizer():
    from tokenizers import pre_tokenizers

    return pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(behavior="isolated")])


def words_of(texts: Iterable[str]) -> set[str]:
    """Every pre-token of ``texts``."""
    pre = _pre_tokenizer()
    return {w for text in texts for w, _ in pre.pre_tokenize_str(text)}


def task_texts(world: World) -> list[str]:
    """Every piece of text a prompt of this task can contain (the prompt wrapper included)."""
    from surgery.core.mcq import BASE_SUFFIX, INSTRUCT_SUFFIX, INSTRUCTION

    stems = [t.format(item="") for _, t in templates()] + [KNOWLEDGE[0].format(item=""), KNOWLEDGE[1]]
    names = [item.word for item in world.items] + list(world.neutral_items)
    return [
        *stems,
        *names,
        *EQUAL.values(),
        *map(identity_text, world.identities),
        INSTRUCTION,
        BASE_SUFFIX,
        INSTRUCT_SUFFIX,
        "(a) (b) (c) a b c A B C",
    ]


def phrases() -> list[str]:
    """The fixed sentences that become single tokens."""
    from surgery.core.mcq import BASE_SUFFIX, INSTRUCTION

    return [INSTRUCTION.strip(), BASE_SUFFIX.strip().rstrip("(").strip()]


def build_tokenizer(world: World):
    """A ``PreTrainedTokenizerFast`` over the task's words; it prepends ``<s>`` to every text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *sorted(words_of(task_texts(world)))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = _pre_tokenizer()
    backend.decoder = decoders.WordPiece(cleanup=True)
    backend.add_tokens([AddedToken(p, normalized=False) for p in phrases()])
    # A fixed first token gives attention heads a place to put weight they do not need.
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )
