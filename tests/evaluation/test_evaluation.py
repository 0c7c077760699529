"""Evaluators and probes: hand-set logits for ranks / teacher forcing, greedy == generate, the hijack set."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import PreTrainedTokenizerFast
from transformers.modeling_outputs import CausalLMOutputWithPast

from data_recipes.base import Recipe
from harness.config import EvalSpec, ModelSpec
from harness.data.encoding import EvalItem
from harness.evaluation import EVALUATORS, PROBES, EvalResult, hijack_token_ids, run_evaluation
from harness.evaluation.hijack import casing_variants
from harness.evaluation.passes import greedy_decode, left_pad
from harness.models.builtin import build_builtin
from harness.models.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------------------------------------------
# Fixtures
# ----------------------------------------------------------------------------------------------------------------


class ExactRecipe(Recipe):
    """Default normaliser / scorer; mode: the answer starts with yes or no."""

    name = "exact_test"

    def build(self, task, n_train, n_eval, seed):  # pragma: no cover - not used here
        raise NotImplementedError

    def mode_ok(self, prediction: str) -> bool:
        return self.normalise(prediction).startswith(("yes", "no"))


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    texts = [
        f"is the {a} {b}? yes it is. no it is not. Yes. No. the {a} of {b} is {i}"
        for i in range(50)
        for a, b in [("cat", "red"), ("sun", "hot"), ("moon", "cold")]
    ]
    return train_tokenizer(texts, vocab_size=320, min_frequency=1)


class Bigram(nn.Module):
    """A causal LM whose logits at each position are a fixed row ``table[input_token]``; counts forward calls."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = nn.Parameter(table.clone())
        self.calls: list[tuple[int, int]] = []

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, cache=None, use_cache=None, logits_to_keep=0, **kwargs
    ):
        self.calls.append(tuple(input_ids.shape))
        logits = self.table[input_ids]
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        return CausalLMOutputWithPast(logits=logits, cache=cache if use_cache else None)


def item(task, split, index, prompt_ids, gold_ids, tok, gold_text=None) -> EvalItem:
    return EvalItem(
        task,
        split,
        index,
        tok.decode(prompt_ids),
        list(prompt_ids),
        gold_text if gold_text is not None else tok.decode(gold_ids, skip_special_tokens=True),
        list(gold_ids),
    )


def tiny_model(tok, seed=0, eos_scale=2.0):
    """A random tiny Qwen2 (untied head, wide init) whose eos row is scaled so some sequences stop early."""
    config = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
        initializer_range=0.3,
    )
    model = build_builtin(ModelSpec(config=config), tok, seed=seed).eval()
    with torch.no_grad():
        model.lm_head.weight[tok.eos_token_id] *= eos_scale
    return model


# ----------------------------------------------------------------------------------------------------------------
# Registries and import weight
# ----------------------------------------------------------------------------------------------------------------


def test_registries_hold_the_contract_names():
    assert EVALUATORS.names() == ["greedy", "mode_ok", "teacher_forced"]
    assert PROBES.names() == ["first_token", "forgetting"]
    with pytest.raises(KeyError, match="did you mean 'greedy'"):
        EVALUATORS.get("gredy")


def test_importing_the_package_does_not_import_torch():
    code = "import sys, harness.evaluation, harness.core.seesaw; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------------------------------------------
# First-token probe on hand-set logits
# ----------------------------------------------------------------------------------------------------------------


def probe_setup(tok):
    """Three prompts ending in tokens a, b, c, gold first tokens with known ranks; c's top-1 is ' yes'."""
    V = len(tok)
    yes = tok.encode(" yes")
    assert len(yes) == 1, "the fixture tokenizer must have a single ' yes' token"
    yes = yes[0]
    a, b, c = (tok.convert_tokens_to_ids(t) for t in ("c", "d", "e"))
    g1, g2, g3 = (tok.convert_tokens_to_ids(t) for t in ("x", "y", "z"))
    table = torch.zeros(V, V)
    table[a, g1] = 5.0  # rank 1
    table[b, [10, 11, 12]] = 3.0  # three tokens strictly above the gold ...
    table[b, 13] = 2.0  # ... one tied with it (ties count against the gold: issue 13) ...
    table[b, g2] = 2.0  # ... so the gold is rank 5
    table[c, yes] = 4.0  # hijacked: ' yes' on top; gold is rank 2
    table[c, g3] = 1.0
    eos = tok.eos_token_id
    items = [
        item("qa", "heldout", 0, [5, 6, a], [g1, eos], tok),
        item("qa", "heldout", 1, [5, b], [g2, eos], tok),
        item("qa", "heldout", 2, [7, 8, 9, c], [g3, eos], tok),
        item("qa", "train", 0, [c], [g3, eos], tok),
    ]
    return Bigram(table), items, yes, (g1, g2, g3)


@pytest.mark.parametrize("evaluators", [[], ["teacher_forced"], ["greedy"], ["greedy", "teacher_forced"]])
def test_first_token_probe_ranks_hijack_and_top1(tok, evaluators):
    model, items, yes, (g1, g2, g3) = probe_setup(tok)
    spec = EvalSpec(evaluators=evaluators, probes=["first_token"], batch_size=2, max_new_tokens=2)
    result = run_evaluation(model, tok, items, {"qa": ExactRecipe()}, spec)

    ranks = [s["gold_first_rank"] for s in result.samples]
    assert ranks == [1, 5, 2, 2]
    assert result.value("qa", "heldout", "ft_rank_mean") == pytest.approx(8 / 3)
    assert result.value("qa", "heldout", "ft_rank_median") == 2
    assert result.value("qa", "heldout", "ft_mrr") == pytest.approx((1 + 1 / 5 + 1 / 2) / 3)
    assert result.value("qa", "heldout", "ft_hijack") == pytest.approx(1 / 3)
    assert result.value("qa", "train", "ft_hijack") == 1.0
    # top-1 tokens on heldout: g1, token 10 (first of the tied maxima, as argmax / greedy pick), ' yes' → share 1/3
    assert result.value("qa", "heldout", "ft_top1") == pytest.approx(1 / 3)
    assert result.top1[("qa", "train")] == [(" yes", 1)]
    assert sorted(count for _, count in result.top1[("qa", "heldout")]) == [1, 1, 1]
    top5 = result.samples[2]["top5"]
    assert top5[0]["id"] == yes and top5[0]["token"] == " yes"
    probs = [t["prob"] for t in top5]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1
    assert top5[0]["prob"] == pytest.approx(math.exp(4) / (math.exp(4) + math.exp(1) + len(tok) - 2))
    assert result.samples[0]["gold_first_id"] == g1


def test_first_token_probe_costs_at_most_one_forward_over_the_prompts(tok):
    model, items, _, _ = probe_setup(tok)
    n_batches = 2  # 4 items, batch_size 2

    def calls(evaluators, probes):
        model.calls.clear()
        spec = EvalSpec(evaluators=evaluators, probes=probes, batch_size=2, max_new_tokens=3)
        run_evaluation(model, tok, items, {"qa": ExactRecipe()}, spec)
        return list(model.calls)

    probe_only = calls([], ["first_token"])
    assert [width for _, width in probe_only] == [2, 4]  # prompts sorted by length: (1, 2) and (3, 4) tokens
    assert len(calls(["teacher_forced"], ["first_token"])) == len(calls(["teacher_forced"], [])) == n_batches
    assert calls(["greedy"], ["first_token"]) == calls(["greedy"], [])  # the prefill's logits are reused
    assert calls(["greedy", "mode_ok"], []) == calls(["greedy"], [])  # mode_ok shares greedy's decoding


# ----------------------------------------------------------------------------------------------------------------
# Teacher forcing and greedy on hand-set logits
# ----------------------------------------------------------------------------------------------------------------


def test_teacher_forced_first_exact_and_loss(tok):
    V, eos = len(tok), tok.eos_token_id
    p1, p2, p3, x, y, z = (tok.convert_tokens_to_ids(t) for t in ("c", "d", "e", "x", "y", "z"))
    table = torch.zeros(V, V)
    table[p1, x] = 3.0  # after p1: x
    table[p2, x] = 3.0
    table[p3, z] = 3.0
    table[x, y] = 2.0  # after x: y
    table[y, eos] = 1.0  # after y: eos
    model = Bigram(table)
    items = [
        item("t", "heldout", 0, [5, p1], [x, y, eos], tok),  # every token is the argmax: exact
        item("t", "heldout", 1, [5, 6, 7, p2], [x, z, eos], tok),  # first right, second wrong
        item("t", "heldout", 2, [p3], [x, y, eos], tok),  # first wrong
    ]
    spec = EvalSpec(evaluators=["teacher_forced"], probes=[], batch_size=8)
    result = run_evaluation(model, tok, items, {"t": ExactRecipe()}, spec)
    assert [(s["tf_first"], s["tf_exact"]) for s in result.samples] == [(True, True), (True, False), (False, False)]
    assert result.value("t", "heldout", "tf_first") == pytest.approx(2 / 3)
    assert result.value("t", "heldout", "tf_exact") == pytest.approx(1 / 3)

    logp = torch.log_softmax(table, dim=-1)
    per_item = []
    for it in items:
        context = [it.prompt_ids[-1]] + it.gold_ids[:-1]
        per_item.append(sum(logp[c, g].item() for c, g in zip(context, it.gold_ids)))
    expected = -sum(per_item)
    assert result.value("t", "heldout", "eval_loss") == pytest.approx(expected / 9, rel=1e-5)
    # the gold answer's summed log-probability, mean over items; each sample carries both loss targets
    assert result.value("t", "heldout", "gold_logprob") == pytest.approx(sum(per_item) / 3, rel=1e-5)
    assert [s["outcomes"]["gold_logprob"] for s in result.samples] == pytest.approx(per_item, rel=1e-5)
    losses = [s["outcomes"]["eval_loss"] for s in result.samples]
    assert sum(losses) / 3 == pytest.approx(expected / 9, rel=1e-5)  # their mean is the token-weighted loss
    assert {m for _, _, m, _ in result.metrics} == {"tf_first", "tf_exact", "eval_loss", "gold_logprob"}
    assert result.samples[0]["pred"] is None and result.samples[0]["top5"] == []


def test_greedy_mode_ok_and_sample_fields(tok):
    V, eos = len(tok), tok.eos_token_id
    yes = tok.encode(" yes")[0]
    no = tok.convert_tokens_to_ids("no")
    p1, p2, p3 = (tok.convert_tokens_to_ids(t) for t in ("c", "d", "e"))
    table = torch.zeros(V, V)
    table[p1, yes] = 1.0
    table[yes, eos] = 1.0  # " yes" then stop
    table[p2, no] = 1.0
    table[no, no] = 1.0  # "no" forever: runs into max_new_tokens
    table[p3, p1] = 1.0
    table[p1, yes] = 1.0
    model = Bigram(table)
    model.train()
    items = [
        item("yn", "heldout", 0, [5, p1], [yes, eos], tok, gold_text="Yes"),
        item("yn", "heldout", 1, [p2], [no, eos], tok, gold_text="no"),
        item("yn", "heldout_template", 0, [6, 7, p3], [yes, eos], tok, gold_text="yes"),
    ]
    spec = EvalSpec(evaluators=["greedy", "mode_ok"], probes=["first_token"], batch_size=2, max_new_tokens=4)
    result = run_evaluation(model, tok, items, {"yn": ExactRecipe()}, spec)
    assert model.training, "the model's train mode is restored"
    preds = [s["pred"] for s in result.samples]
    assert preds == [" yes", "nononono", tok.decode([p1, yes])]
    assert [s["correct"] for s in result.samples] == [True, False, False]
    assert [s["mode_ok"] for s in result.samples] == [True, True, False]
    assert result.value("yn", "heldout", "greedy") == 0.5
    assert result.value("yn", "heldout", "mode_ok") == 1.0
    assert result.value("yn", "heldout_template", "mode_ok") == 0.0
    keys = {"task", "split", "prompt", "gold", "pred", "correct", "mode_ok", "gold_first_id", "gold_first_rank", "top5"}
    for sample, it in zip(result.samples, items):
        assert keys <= set(sample)
        assert sample["prompt"] == it.prompt_text and sample["gold"] == it.gold_text
        assert all(set(t) == {"token", "id", "prob"} for t in sample["top5"]) and len(sample["top5"]) == 5
    # one value per task × split × metric, nothing that was not asked for
    pairs = [(t, s, m) for t, s, m, _ in result.metrics]
    assert len(pairs) == len(set(pairs)) == 2 * (3 + 6)  # greedy, truncated, mode_ok + first_token's 5 + ft_nonfinite
    assert result.value("yn", "heldout", "ft_nonfinite") == 0.0
    assert not {m for *_, m in pairs} & {"tf_first", "tf_exact", "eval_loss", "gold_logprob"}


def test_no_components_means_no_model_calls(tok):
    model, items, _, _ = probe_setup(tok)
    result = run_evaluation(model, tok, items, {"qa": ExactRecipe()}, EvalSpec(evaluators=[], probes=[]))
    assert model.calls == [] and result.metrics == [] and len(result.samples) == len(items)
    assert isinstance(result, EvalResult)


def test_missing_recipe_is_a_clear_error(tok):
    model, items, _, _ = probe_setup(tok)
    with pytest.raises(KeyError, match="no recipe for task"):
        run_evaluation(model, tok, items, {}, EvalSpec())


# ----------------------------------------------------------------------------------------------------------------
# Greedy decoding == model.generate on a random tiny model
# ----------------------------------------------------------------------------------------------------------------


def _generate(model, prompts, tok, max_new_tokens):
    ids, mask, _ = left_pad(prompts, tok.pad_token_id)
    out = model.generate(
        ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    return out[:, ids.shape[1] :].tolist()


def _padded(rows, width, pad):
    return [row + [pad] * (width - len(row)) for row in rows]


def test_greedy_decode_equals_generate(tok):
    model = tiny_model(tok)
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(4, len(tok), (int(n),), generator=gen).tolist()
        for n in torch.randint(1, 14, (12,), generator=gen)
    ]
    eos = tok.eos_token_id
    for max_new in (1, 10):
        ours, _ = greedy_decode(model, prompts, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=tok.pad_token_id)
        theirs = _generate(model, prompts, tok, max_new)
        assert _padded(ours, len(theirs[0]), tok.pad_token_id) == theirs
        assert all(len(row) <= max_new for row in ours)
    lengths = [len(row) for row in ours]
    stopped = [row[-1] == eos for row in ours]
    assert any(stopped) and not all(stopped), "the fixture must mix early eos and max_new_tokens"
    assert len(set(lengths)) > 2 and len({len(p) for p in prompts}) > 4


def test_run_evaluation_greedy_matches_generate_per_batch(tok):
    model = tiny_model(tok, seed=1)
    msgs = [
        "is the cat red?",
        "the sun",
        "is the moon cold? yes it is. no it is not.",
        "hot",
        "the moon of cat is 7",
        "is the sun hot? is the moon cold?",
        "red",
        "no",
    ]
    items = []
    for i, text in enumerate(msgs):
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        items.append(EvalItem("chat", "heldout", i, prompt, ids, "yes", tok.encode("yes") + [tok.eos_token_id]))
    spec = EvalSpec(evaluators=["greedy"], probes=[], batch_size=3, max_new_tokens=8)
    result = run_evaluation(model, tok, items, {"chat": ExactRecipe()}, spec)
    # the harness batches items sorted by prompt length; generate on the same batches must agree token for token
    order = sorted(range(len(items)), key=lambda i: len(items[i].prompt_ids))
    for start in range(0, len(order), 3):
        chunk = order[start : start + 3]
        theirs = _generate(model, [items[i].prompt_ids for i in chunk], tok, 8)
        for i, row in zip(chunk, theirs):
            assert result.samples[i]["pred"] == tok.decode(row, skip_special_tokens=True)


def test_probe_sources_agree_on_a_real_model(tok):
    model = tiny_model(tok, seed=2)
    gen = torch.Generator().manual_seed(3)
    items = []
    for i in range(10):
        prompt = torch.randint(4, len(tok), (int(torch.randint(2, 12, (1,), generator=gen)),), generator=gen).tolist()
        gold = torch.randint(4, len(tok), (int(torch.randint(1, 4, (1,), generator=gen)),), generator=gen).tolist()
        items.append(item("r", "heldout", i, prompt, gold + [tok.eos_token_id], tok))
    results = {}
    for evaluators in ([], ["greedy"], ["teacher_forced"]):
        spec = EvalSpec(evaluators=evaluators, probes=["first_token"], batch_size=4, max_new_tokens=2)
        res = run_evaluation(model, tok, items, {"r": ExactRecipe()}, spec)
        results[tuple(evaluators)] = [(s["gold_first_rank"], s["top5"][0]["id"]) for s in res.samples]
    assert results[()] == results[("greedy",)] == results[("teacher_forced",)]
    # and the greedy prediction starts with the probe's top-1 token
    spec = EvalSpec(evaluators=["greedy"], probes=["first_token"], batch_size=4, max_new_tokens=1)
    res = run_evaluation(model, tok, items, {"r": ExactRecipe()}, spec)
    for s in res.samples:
        assert s["pred"] == tok.decode([s["top5"][0]["id"]], skip_special_tokens=True)


# ----------------------------------------------------------------------------------------------------------------
# The hijack set
# ----------------------------------------------------------------------------------------------------------------


def test_casing_variants():
    assert casing_variants("yes") == ["yes", "Yes", "YES"]
    assert casing_variants("iPhone") == ["iPhone", "iphone", "Iphone", "IPHONE"]


def test_hijack_set_with_leading_space_tokens(tok):
    ids = hijack_token_ids(tok, ["yes", "no"])
    for text in (" yes", " no", "yes", "no", " Yes", " No"):
        encoded = tok.encode(text)
        if len(encoded) == 1:
            assert encoded[0] in ids, text
    assert tok.encode(" yes")[0] in ids and tok.convert_tokens_to_ids("Ġyes") in ids
    for token_id in ids:  # nothing else: each member is (a ≥2-char prefix of) a variant
        piece = tok.decode([token_id]).strip()
        assert len(piece) >= 2 and any(v.startswith(piece) for w in ("yes", "no") for v in casing_variants(w))
    assert tok.encode(" cat")[0] not in ids


def test_hijack_set_without_leading_space_tokens():
    # byte-level BPE that only ever saw the words at the start of a line: " yes" is "Ġ" + "yes"
    texts = ["yes\nno\nyes\nno\nYes\nNo"] * 20
    bpe = train_tokenizer(texts, vocab_size=280, min_frequency=1)
    assert len(bpe.encode(" yes")) == 2
    ids = hijack_token_ids(bpe, ["yes", "no"])
    assert ids == {bpe.convert_tokens_to_ids(t) for t in ("yes", "no", "Yes", "No")}

    # a word-level tokenizer: no leading-space forms at all, unknown variants skipped
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "yes": 1, "Yes": 2, "no": 3, "maybe": 4}
    word = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="[UNK]")
    assert hijack_token_ids(fast, ["yes", "no"]) == {1, 2, 3}


class SplitTokenizer:
    """A stand-in tokenizer with fixed segmentations, to pin the multi-token rule."""

    def __init__(self, segmentations: dict[str, list[str]]):
        self.segmentations = segmentations
        pieces = sorted({p for seg in segmentations.values() for p in seg})
        self.vocab = {p: i + 1 for i, p in enumerate(pieces)}
        self.unk_token_id = 0

    def get_vocab(self):
        return dict(self.vocab)

    def encode(self, text, add_special_tokens=False):
        return [self.vocab[p] for p in self.segmentations.get(text, ["<unk>"])] if text in self.segmentations else [0]

    def decode(self, ids):
        inverse = {i: p for p, i in self.vocab.items()}
        return "".join(inverse[i] for i in ids).replace("Ġ", " ")


def test_hijack_multi_token_rule():
    t = SplitTokenizer(
        {
            "yes": ["ye", "s"],  # first piece "ye" is a 2-char prefix: kept
            "Yes": ["Y", "es"],  # "Y" is too short: dropped
            "YES": ["YES"],  # single token: kept
            " yes": ["Ġ", "yes"],  # a bare space: dropped
            " Yes": ["ĠYe", "s"],  # " Ye" → "Ye": kept
            "no": ["n", "o"],
            " no": ["Ġno"],
            "No": ["Nx", "o"],  # "Nx" is not a prefix of "No": dropped
        }
    )
    v = t.vocab
    assert hijack_token_ids(t, ["yes", "no"]) == {v["ye"], v["YES"], v["ĠYe"], v["Ġno"]}


def test_each_module_gets_its_own_mode_back(tok):
    model = tiny_model(tok, seed=4)
    model.train()
    model.model.layers[0].eval()  # e.g. a frozen part kept in eval mode on purpose
    seen = []
    model.model.layers[1].register_forward_pre_hook(lambda module, args: seen.append(module.training))
    it = item("r", "heldout", 0, [5, 6, 7], [8, tok.eos_token_id], tok)
    run_evaluation(model, tok, [it], {"r": ExactRecipe()}, EvalSpec(max_new_tokens=2))
    assert seen and not any(seen), "evaluation runs in eval mode"
    assert model.training and model.model.layers[1].training and not model.model.layers[0].training
