"""The registered attention function: exact eager equivalence, features, knockout, edge-α, generation."""

from __future__ import annotations

import pytest
import torch

from surgery.core.errors import SurgeryError
from surgery.find.heads.attention import AttentionPlan, EdgeEdit, active_plan, surgery_attention_on
from surgery.model.loading import load_model

ARCHS = ["llama", "gemma2", "gemma3_text", "qwen2"]  # gemma2: soft-capping; gemma2/3: sliding windows
B, L = 2, 14
ITEM, OPT_A, OPT_B = slice(4, 6), slice(8, 10), slice(11, 13)


def _inputs():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 90, (B, L), generator=g)
    att = torch.ones_like(ids)
    att[1, :3] = 0  # left padding in row 1: its spans still sit at the same absolute positions
    masks = {k: torch.zeros(B, L, dtype=torch.bool) for k in ("a", "b", "item", "tested", "control")}
    masks["item"][:, ITEM] = True
    masks["a"][:, OPT_A] = masks["tested"][:, OPT_A] = True
    masks["b"][:, OPT_B] = masks["control"][:, OPT_B] = True
    return ids, att, masks


@pytest.fixture(scope="module", params=ARCHS)
def model(request, tmp_path_factory):
    from tests.support.tiny import build_tiny

    path = build_tiny(request.param, tmp_path_factory.mktemp(request.param) / "m")
    m = load_model(path)
    m.set_attn_implementation("eager")
    return m


def test_no_plan_equals_eager_and_features_equal_attention_maps(model):
    ids, att, masks = _inputs()
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=att, output_attentions=True)
        with surgery_attention_on(model):
            assert model.config._attn_implementation == "surgery"
            plain = model(input_ids=ids, attention_mask=att).logits
            plan = AttentionPlan(masks, features=True)
            with active_plan(plan):
                featured = model(input_ids=ids, attention_mask=att).logits
    assert model.config._attn_implementation == "eager"  # restored
    assert torch.equal(plain, ref.logits) and torch.equal(featured, ref.logits)
    expected = torch.stack(
        [
            (att_l[:, :, OPT_A, ITEM].sum(-1).mean(-1) + att_l[:, :, OPT_B, ITEM].sum(-1).mean(-1)) / 2
            for att_l in ref.attentions
        ],
        dim=1,
    )
    got = plan.features_tensor(len(ref.attentions))
    assert got.shape == (B, len(ref.attentions), model.config.num_attention_heads)
    torch.testing.assert_close(got, expected.float(), rtol=0, atol=1e-6)
    # only per-head aggregates are kept: (B, 2, H) per layer, never maps
    assert all(v.shape == (B, 2, model.config.num_attention_heads) for v in plan.bind.values())


def test_knockout_removes_exactly_the_chosen_edges(model):
    ids, att, masks = _inputs()
    layer, head = 1, 2
    with torch.inference_mode(), surgery_attention_on(model):
        ref = model(input_ids=ids, attention_mask=att, output_attentions=True)
        with active_plan(AttentionPlan(masks, edit=EdgeEdit({layer: (head,)}, 0.0))):
            ko = model(input_ids=ids, attention_mask=att, output_attentions=True)
    a, r = ko.attentions[layer], ref.attentions[layer]
    assert torch.all(a[:, head][:, OPT_A][:, :, ITEM] == 0)  # the edges are gone
    assert torch.all(r[:, head][:, OPT_A][:, :, ITEM] > 0)  # and were there before
    others = [h for h in range(model.config.num_attention_heads) if h != head]
    assert torch.equal(a[:, others], r[:, others])  # other heads untouched
    rows = torch.ones(L, dtype=torch.bool)
    rows[OPT_A] = False
    assert torch.equal(a[:, head][:, rows], r[:, head][:, rows])  # other query rows untouched
    torch.testing.assert_close(a[:, head].sum(-1)[att.bool()], torch.ones(int(att.sum())))  # renormalised
    assert all(torch.equal(ko.attentions[i], ref.attentions[i]) for i in range(layer))  # earlier layers
    assert not torch.equal(ko.logits, ref.logits)


def test_alpha_one_is_identity_and_alpha_is_linear(model):
    ids, att, masks = _inputs()
    heads = {0: (0, 3), 2: (1,)}
    runs = {}
    with torch.inference_mode(), surgery_attention_on(model):
        ref = model(input_ids=ids, attention_mask=att, output_attentions=True)
        for alpha in (0.0, 1.0, 2.5):
            with active_plan(AttentionPlan(masks, edit=EdgeEdit(heads, alpha))):
                runs[alpha] = model(input_ids=ids, attention_mask=att, output_attentions=True)
    assert torch.equal(runs[1.0].logits, ref.logits)
    # layer 0 sees unedited inputs: the edited weights are P_ko + α (P − P_ko)
    p, p0, p25 = ref.attentions[0], runs[0.0].attentions[0], runs[2.5].attentions[0]
    torch.testing.assert_close(p25, p0 + 2.5 * (p - p0), rtol=0, atol=1e-6)


def test_edge_edit_applies_to_the_prompt_pass_of_generate(model):
    ids, att, masks = _inputs()
    edit = EdgeEdit({1: (0, 1)}, 0.0)
    with torch.inference_mode(), surgery_attention_on(model):
        with active_plan(AttentionPlan(masks, edit=edit)):
            first = model(input_ids=ids, attention_mask=att).logits[:, -1].argmax(-1)
            gen = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=3, do_sample=False, pad_token_id=0)
        plain = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert torch.equal(gen[:, L], first)
    assert gen.shape == plain.shape == (B, L + 3)


def test_plan_for_another_length_is_an_error(model):
    ids, att, masks = _inputs()
    with surgery_attention_on(model), active_plan(AttentionPlan(masks, features=True)):
        with pytest.raises(SurgeryError, match="plan built for 14-token"):
            model(input_ids=ids[:, :10], attention_mask=att[:, :10])
