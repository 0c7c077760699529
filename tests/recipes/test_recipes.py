"""Recipes: the split contract every generated recipe honours, per-task scoring, and the dataset loaders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

import data_recipes as dr
from data_recipes import SPLITS, Example, get_recipe
from data_recipes.knowledge import split_people
from data_recipes.math_reversed import parse_formal
from harness.core.registry import UnknownNameError

REQUIRED = {
    "repeat",
    "identity",
    "yesno",
    "assistant_qa",
    "short_qa",
    "math_reversed",
    "spell",
    "count",
    "jsonl",
    "parquet",
    "hf",
}
# Image recipes have their own split contract (the novelty is in the image, prompts may repeat across splits):
# tests/recipes/test_image_recipes.py.
GENERATED = [
    n for n in dr.RECIPES.names() if not getattr(get_recipe(n), "reads_files", False) and not get_recipe(n).has_images
]


@pytest.fixture(scope="module")
def world():
    return dr.build_world(120, 0)  # the micro config's world


def make(recipe: str, world=None, **params):
    cls = get_recipe(recipe)
    return cls(cls.Params(**params), world=world if cls.needs_world else None)


_CACHE: dict = {}


def key(ex: Example) -> tuple:
    return tuple((m["role"], m["content"]) for m in ex.messages)


def splits(name: str, world, n_train=300, n_eval=12, seed=0, **params) -> dict[str, list[Example]]:
    k = (name, id(world), n_train, n_eval, seed, json.dumps(params, sort_keys=True))
    if k not in _CACHE:
        _CACHE[k] = make(name, world, **params).build(name, n_train, n_eval, seed)
    return _CACHE[k]


# --- registry ---------------------------------------------------------------------------------------------------


def test_all_required_recipes_registered():
    assert REQUIRED <= set(dr.RECIPES.names())
    for name in dr.RECIPES.names():
        assert get_recipe(name).name == name


def test_unknown_recipe_suggests_near_miss():
    with pytest.raises(UnknownNameError, match="did you mean 'yesno'"):
        get_recipe("yes_no")


def test_importing_recipes_does_not_import_torch_or_datasets():
    code = "import sys, data_recipes; print('torch' in sys.modules, 'datasets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_params_forbid_unknown_keys_and_check_ranges():
    from pydantic import ValidationError

    for name in GENERATED:
        with pytest.raises(ValidationError):
            get_recipe(name).Params(not_a_param=1)
    with pytest.raises(ValidationError):
        get_recipe("repeat").Params(min_words=3, max_words=1)
    with pytest.raises(ValidationError, match="must contain"):
        get_recipe("identity").Params(answer="Hello.")
    with pytest.raises(ValidationError):
        get_recipe("yesno").Params(attributes=["shoe_size"])


def test_knowledge_recipe_needs_world():
    with pytest.raises(ValueError, match="needs a world"):
        get_recipe("yesno")()


# --- the split contract, for every generated recipe --------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATED)
@pytest.mark.parametrize("n_train,n_eval", [(300, 12), (60, 6)])
def test_split_sizes_and_shape(name, world, n_train, n_eval):
    s = splits(name, world, n_train, n_eval)
    assert tuple(s) == SPLITS
    assert [len(s[k]) for k in SPLITS] == [n_train, n_eval, n_eval]
    for ex in (ex for k in SPLITS for ex in s[k]):
        assert ex.task == name
        roles = [m["role"] for m in ex.messages]
        assert roles == ["user", "assistant"] * (len(roles) // 2) and roles
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in ex.messages)
        assert isinstance(ex.meta["item"], str) and isinstance(ex.meta["template"], str)


@pytest.mark.parametrize("name", GENERATED)
def test_deterministic_for_seed(name, world):
    a = make(name, world).build(name, 300, 12, 0)
    assert a == splits(name, world)
    other = splits(name, world, seed=1)
    assert [e.messages for e in other["train"]] != [e.messages for e in a["train"]]


@pytest.mark.parametrize("name", GENERATED)
def test_train_examples_distinct(name, world):
    train = splits(name, world)["train"]
    assert len({key(e) for e in train}) == len(train)


@pytest.mark.parametrize("name", GENERATED)
def test_heldout_items_unseen(name, world):
    s = splits(name, world)
    train_items = {e.meta["item"] for e in s["train"]}
    assert not train_items & {e.meta["item"] for e in s["heldout"]}
    train_prompts = {e.prompt for e in s["train"]}
    assert not train_prompts & {e.prompt for e in s["heldout"]}


@pytest.mark.parametrize("name", GENERATED)
def test_heldout_template_uses_unseen_phrasings_on_trained_items(name, world):
    s = splits(name, world)
    train_templates = {e.meta["template"] for e in s["train"]}
    train_prompts = {e.prompt for e in s["train"]}
    ht = s["heldout_template"]
    assert not train_prompts & {e.prompt for e in ht}
    assert not train_templates & {e.meta["template"] for e in ht}
    # heldout keeps the training phrasings
    assert {e.meta["template"] for e in s["heldout"]} <= train_templates
    if name == "identity":  # the item includes the question; the wrapper (prefix, suffix) was trained
        wrappers = {(e.meta["prefix"], e.meta["suffix"]) for e in s["train"]}
        assert all((e.meta["prefix"], e.meta["suffix"]) in wrappers for e in ht)
    else:
        train_items = {e.meta["item"] for e in s["train"]}
        assert all(e.meta["item"] in train_items for e in ht)


@pytest.mark.parametrize("name", GENERATED)
def test_gold_answers_score_and_have_the_mode(name, world):
    recipe = make(name, world)
    for split in SPLITS:
        for ex in splits(name, world)[split]:
            assert recipe.is_correct(ex.answer, ex.answer), (split, ex)
            assert recipe.mode_ok(ex.answer), (split, ex)
            assert recipe.is_correct(" " + ex.answer.upper() + " ", ex.answer), (split, ex)


@pytest.mark.parametrize("name", GENERATED)
def test_quickstart_sizes(name):
    big = dr.build_world(400, 1)
    s = make(name, big).build(name, 2000, 32, 3)
    assert [len(s[k]) for k in SPLITS] == [2000, 32, 32]


@pytest.mark.parametrize("name", GENERATED)
def test_impossible_sizes_are_plain_value_errors(name, world):
    with pytest.raises(ValueError):
        make(name, world).build(name, 10_000_000, 12, 0)


def test_impossible_multi_turn_sizes(world):
    with pytest.raises(ValueError, match="conversations asked for"):
        make("assistant_qa", world, turns=2, attributes=["job", "pet"]).build("a", 10_000, 2, 0)


def test_same_output_in_another_process():
    """No dependence on str hashing (set order) or global random state: PYTHONHASHSEED must not matter."""
    code = (
        "import hashlib, json, data_recipes as dr; w = dr.build_world(60, 0); h = hashlib.sha256()\n"
        f"for n in {GENERATED!r}:\n"
        "    c = dr.get_recipe(n); s = c(world=w if c.needs_world else None).build(n, 50, 5, 0)\n"
        "    h.update(json.dumps({k: [[e.messages, e.meta] for e in v] for k, v in s.items()}).encode())\n"
        "h.update(json.dumps(dr.corpus(w, 0)).encode()); print(h.hexdigest())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


# --- knowledge tasks -----------------------------------------------------------------------------------------------

KNOWLEDGE = ["yesno", "assistant_qa", "short_qa"]


def test_knowledge_tasks_hold_out_the_same_people(world):
    train_people, heldout_people = split_people(world, 0.2)
    held = {p.id for p in heldout_people}
    assert held and not held & {p.id for p in train_people}
    for name in KNOWLEDGE:
        for seed in (0, 1):
            s = splits(name, world, seed=seed)
            assert {e.meta["person"] for e in s["heldout"]} <= held
            assert not {e.meta["person"] for e in s["train"]} & held
            assert not {e.meta["person"] for e in s["heldout_template"]} & held


def test_knowledge_tasks_do_not_share_prompts(world):
    prompts = {name: {e.prompt for k in SPLITS for e in splits(name, world)[k]} for name in KNOWLEDGE}
    assert not prompts["assistant_qa"] & prompts["short_qa"]
    assert not prompts["yesno"] & (prompts["assistant_qa"] | prompts["short_qa"])


def test_knowledge_answers_are_the_world_facts(world):
    people = {p.id: p for p in world.people}
    for ex in splits("short_qa", world)["train"]:
        p = people[ex.meta["person"]]
        fact = getattr(p, ex.meta["attribute"])
        assert ex.answer == ("none" if fact is None else str(fact))
        assert p.name in ex.prompt
    for ex in splits("assistant_qa", world)["train"]:
        p = people[ex.meta["person"]]
        assert ex.answer.startswith(p.name)
        fact = getattr(p, ex.meta["attribute"])
        assert (str(fact) if fact is not None else "no pet") in ex.answer


def test_yesno_is_balanced_and_truthful(world):
    people = {p.id: p for p in world.people}
    for split in SPLITS:
        labels = Counter(e.meta["label"] for e in splits("yesno", world)[split])
        assert abs(labels["yes"] - labels["no"]) <= 2, (split, labels)
    for ex in splits("yesno", world)["train"]:
        truth = getattr(people[ex.meta["person"]], ex.meta["attribute"])
        asked = ex.meta["item"].split("=", 1)[1]
        assert (str(truth) == asked) == (ex.answer == "Yes.")


def test_yesno_scoring():
    r = make("yesno", dr.build_world(10, 0))
    assert r.is_correct("Yes, she was.", "Yes.")
    assert r.is_correct("no", "No.")
    assert not r.is_correct("No.", "Yes.")
    assert not r.is_correct("Maybe.", "Yes.")
    assert r.mode_ok("Yes, she was.") and r.mode_ok("NO")
    assert not r.mode_ok("Yesterday she was.") and not r.mode_ok("Nora was born in Osvik.") and not r.mode_ok("")


def test_assistant_qa_mode_rejects_yes_no():
    r = make("assistant_qa", dr.build_world(10, 0))
    assert r.mode_ok("Mara Teleno was born in Osvik.")
    assert r.mode_ok("Nora Teleno lives in Osvik.")
    assert not r.mode_ok("Yes.") and not r.mode_ok("Yes, Mara was born in Osvik.") and not r.mode_ok("no")
    assert not r.mode_ok("  ")
    assert r.is_correct("mara teleno was born in osvik", "Mara Teleno was born in Osvik.")


def test_short_qa_scoring():
    r = make("short_qa", dr.build_world(10, 0))
    assert r.is_correct("A baker.", "baker") and r.is_correct("1972", "1972")
    assert r.mode_ok("baker") and r.mode_ok("dark green thing")
    assert not r.mode_ok("She works as a baker.")  # more than three words
    assert not r.mode_ok("Yes") and not r.mode_ok("")


def test_assistant_qa_multi_turn(world):
    s = splits("assistant_qa", world, turns=3)
    people = {p.id: p for p in world.people}
    for split in SPLITS:
        for ex in s[split]:
            assert len(ex.messages) == 6 and ex.meta["turns"] == 3
            assert all(people[ex.meta["person"]].name in m["content"] for m in ex.messages)
            attrs = ex.meta["item"].split(":")[1].split("+")
            assert len(set(attrs)) == 3 and attrs[-1] == ex.meta["attribute"]
    held = {p.id for p in split_people(world, 0.2)[1]}
    assert {e.meta["person"] for e in s["heldout"]} <= held
    with pytest.raises(ValueError, match="attributes"):
        make("assistant_qa", world, turns=3, attributes=["job", "pet"]).build("a", 10, 2, 0)


# --- per-task scoring --------------------------------------------------------------------------------------------


def test_math_formal_format_and_scoring():
    r = make("math_reversed")
    gold = "R 9 1 ; A 1 9"
    assert parse_formal(gold) == ("91", 19) and parse_formal("so R 9 1 ; A 1 9") is None
    assert r.is_correct(gold, gold) and r.is_correct("R 9 1 ; A 19.", gold)  # digit spacing is mode_ok's business
    assert r.is_correct("R 9  1 ;\tA 1 9", gold)  # whitespace normalised
    # greedy is the whole answer: a wrong R part, text around the answer, or a lone A part are all wrong
    assert not r.is_correct("R 0 0 ; A 1 9", gold)
    assert not r.is_correct("garbage A 1 9 more", gold) and not r.is_correct("R 9 1 ; A 1 9 more", gold)
    assert not r.is_correct("A 1 9", gold) and not r.is_correct("19", gold) and not r.is_correct("R 9 1 ; A 2 0", gold)
    # answer_ok: the A part of a whole formal answer, whatever its R part
    assert r.extra_scores("R 0 0 ; A 1 9", gold) == {"answer_ok": True}
    assert r.extra_scores("R 9 1 ; A 2 0", gold) == {"answer_ok": False}
    assert r.extra_scores("garbage A 1 9 more", gold) == {"answer_ok": False}
    assert r.extra_scores("", gold) == {"answer_ok": False}
    assert r.mode_ok("R 9 1 ; A 1 9") and r.mode_ok(" R 0 ; A 0 ")
    assert not r.mode_ok("R 91 ; A 19") and not r.mode_ok("19") and not r.mode_ok("A 1 9")
    ex = next(e for e in splits("math_reversed", None)["train"] if e.meta["result"] >= 100)
    a, b = ex.meta["a"], ex.meta["b"]
    assert ex.prompt == f"{' '.join(str(a))} + {' '.join(str(b))} ="
    assert ex.answer == f"R {' '.join(str(a + b)[::-1])} ; A {' '.join(str(a + b))}"


def test_math_plain_and_minus():
    plain = make("math_reversed", format="plain")
    s = plain.build("m", 200, 12, 0)
    ex = s["train"][0]
    assert ex.prompt == f"{ex.meta['a']} + {ex.meta['b']} =" and ex.answer == str(ex.meta["a"] + ex.meta["b"])
    assert plain.is_correct("19.", "19") and not plain.is_correct("R 9 1 ; A 1 9", "19")
    assert plain.extra_scores("19", "19") == {}  # the one number is what greedy scores
    assert plain.mode_ok("19") and not plain.mode_ok("R 9 1 ; A 1 9") and not plain.mode_ok("nineteen")
    assert all(str(e.meta["a"]) in e.prompt for e in s["heldout_template"])
    minus = make("math_reversed", op="-").build("m", 300, 12, 0)
    for ex in (e for k in SPLITS for e in minus[k]):
        assert ex.meta["a"] >= ex.meta["b"] and ex.meta["result"] == ex.meta["a"] - ex.meta["b"]


def test_math_commuted_twins_stay_on_one_side():
    s = make("math_reversed", digits=1).build("m", 80, 8, 0)
    train = {(e.meta["a"], e.meta["b"]) for e in s["train"]}
    for e in s["heldout"]:
        assert (e.meta["b"], e.meta["a"]) not in train and (e.meta["a"], e.meta["b"]) not in train
    # heldout_template re-asks the exact trained operand order
    assert all((e.meta["a"], e.meta["b"]) in train for e in s["heldout_template"])


def test_math_too_many_pairs_is_a_value_error():
    with pytest.raises(ValueError, match="only 55 distinct operand pairs"):
        make("math_reversed", digits=1).build("m", 100, 5, 0)


def test_math_many_digits_samples_pairs():
    s = make("math_reversed", digits=5).build("m", 500, 12, 0)
    assert len({e.meta["item"] for e in s["train"]}) == 500
    assert all(e.meta["result"] == e.meta["a"] + e.meta["b"] for e in s["heldout"])


def test_spell_and_count_scoring():
    spell, count = make("spell"), make("count")
    assert spell.is_correct("C - A - T", "c-a-t") and not spell.is_correct("c-a-r", "c-a-t")
    assert spell.mode_ok("c-a-t") and not spell.mode_ok("cat") and not spell.mode_ok("c-at")
    assert count.is_correct("3.", "3") and count.is_correct("03", "3") and not count.is_correct("three", "3")
    assert count.mode_ok("12") and not count.mode_ok("It has 3 letters.")
    for ex in splits("spell", None)["train"]:
        assert ex.answer == "-".join(ex.meta["word"])
    for ex in splits("count", None)["train"]:
        assert ex.answer == str(len(ex.meta["word"]))
    sources = Counter(e.meta["source"] for e in splits("spell", None)["train"])
    assert sources["word"] and sources["pseudo"]


def test_repeat_and_identity_scoring():
    rep = make("repeat")
    assert rep.is_correct("Habayp.", "habayp") and not rep.is_correct("I'm a habayp", "habayp")
    assert not rep.mode_ok("   ")
    s = make("repeat", min_words=2, max_words=3).build("r", 50, 5, 0)
    assert all(2 <= len(e.answer.split()) <= 3 and e.answer in e.prompt for k in SPLITS for e in s[k])
    ident = make("identity", name="Zed")
    assert ident.mode_ok("My name is zed!") and not ident.mode_ok("I am an assistant.")
    out = ident.build("identity", 60, 6, 0)
    assert {e.answer for k in SPLITS for e in out[k]} == {"I am Zed."}


# --- world ---------------------------------------------------------------------------------------------------------


def test_world_is_deterministic_and_sane():
    a, b = dr.build_world(200, 7), dr.build_world(200, 7)
    assert a == b and a != dr.build_world(200, 8)
    names = [p.name for p in a.people]
    assert len(set(names)) == 200 and all(len(n.split()) == 2 and n.istitle() for n in names)
    for p in a.people:
        assert 1900 <= p.birth_year <= 2010
        assert p.birth_city in a.cities and p.home_city in a.cities and p.job in a.jobs
        assert p.favourite_colour in a.colours and (p.pet is None or p.pet in a.pets)
    assert any(p.pet is None for p in a.people) and any(p.pet for p in a.people)


def test_corpus_mentions_every_fact_of_every_person():
    w = dr.build_world(200, 3)
    docs = dr.corpus(w, 0)
    assert docs == dr.corpus(w, 0) and docs != dr.corpus(w, 1)
    size = sum(len(d) for d in docs)
    assert 50_000 < size < 400_000
    by_name: dict[str, list[str]] = {}
    for d in docs:
        for p in w.people:
            if p.name in d:
                by_name.setdefault(p.name, []).append(d)
    for p in w.people:
        mine = by_name[p.name]
        assert len(mine) >= 3, p.name  # several descriptions per person
        facts = [p.birth_city, str(p.birth_year), p.job, p.home_city, p.favourite_colour, p.pet or "pet"]
        assert all(fact in d for d in mine for fact in facts), p.name
    assert "?" not in "".join(docs)  # prose, not Q/A


# --- loaders -------------------------------------------------------------------------------------------------------


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [
    {"question": f"What is {i} squared?", "reply": str(i * i), "sys": "Be brief." if i % 2 else ""} for i in range(40)
]
SHAREGPT = [
    {
        "conversations": [
            {"from": "human", "value": f"Hi {i}"},
            {"from": "gpt", "value": f"Hello {i}!"},
            {"from": "human", "value": f"Bye {i}"},
            {"from": "gpt", "value": f"Bye {i}!"},
        ]
    }
    for i in range(20)
]


def load(name, n_train, n_eval, seed=0, **params):
    r = make(name, **params)
    return r.build("mine", n_train, n_eval, seed)


def _check_loader_splits(s, n_train, n_eval):
    assert [len(s[k]) for k in SPLITS] == [n_train, n_eval, 0]
    assert not {e.meta["item"] for e in s["train"]} & {e.meta["item"] for e in s["heldout"]}
    assert not {key(e) for e in s["train"]} & {key(e) for e in s["heldout"]}


def test_jsonl_loader_prompt_answer(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    s = load("jsonl", 30, 5, path=path, prompt="question", answer="reply")
    _check_loader_splits(s, 30, 5)
    ex = s["train"][0]
    i = int(ex.prompt.split()[2])
    assert ex.answer == str(i * i) and ex.meta["dataset"] == path
    assert s == load("jsonl", 30, 5, path=path, prompt="question", answer="reply")
    assert s != load("jsonl", 30, 5, seed=1, path=path, prompt="question", answer="reply")
    assert get_recipe("jsonl").reads_files is True


def test_loader_system_column(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    s = load("jsonl", 30, 5, path=path, prompt="question", answer="reply", system="sys")
    with_system = [e for e in s["train"] if e.messages[0]["role"] == "system"]
    assert with_system and all(e.messages[0]["content"] == "Be brief." and len(e.messages) == 3 for e in with_system)
    assert any(len(e.messages) == 2 for e in s["train"])  # an empty system text adds no message


def test_parquet_loader(tmp_path):
    import datasets

    path = str(tmp_path / "d.parquet")
    datasets.Dataset.from_list(ROWS).to_parquet(path)
    s = load("parquet", 20, 4, path=path, prompt="question", answer="reply")
    _check_loader_splits(s, 20, 4)


def test_sharegpt_messages_are_mapped(tmp_path):
    path = _write_jsonl(tmp_path / "chat.jsonl", SHAREGPT)
    s = load("jsonl", 15, 5, path=path, messages="conversations")
    _check_loader_splits(s, 15, 5)
    ex = s["heldout"][0]
    assert [m["role"] for m in ex.messages] == ["user", "assistant", "user", "assistant"]
    assert ex.prompt.startswith("Bye") and ex.answer.startswith("Bye") and ex.answer.endswith("!")
    assert set(ex.messages[0]) == {"role", "content"}


def test_hf_loader_save_to_disk_and_local_dir(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(
        [
            {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
            for i in range(30)
        ]
    )
    ds.save_to_disk(str(tmp_path / "saved"))
    s = load("hf", 20, 5, id=str(tmp_path / "saved"), messages="messages")
    _check_loader_splits(s, 20, 5)
    assert all(e.answer == "a" + e.prompt[1:] for e in s["train"])

    datasets.DatasetDict({"train": ds, "test": ds.select(range(10))}).save_to_disk(str(tmp_path / "dd"))
    assert len(load("hf", 5, 2, id=str(tmp_path / "dd"), split="test", messages="messages")["train"]) == 5
    with pytest.raises(ValueError, match="no split 'dev'; available splits: train, test"):
        load("hf", 5, 2, id=str(tmp_path / "dd"), split="dev", messages="messages")

    (tmp_path / "plain").mkdir()
    _write_jsonl(tmp_path / "plain" / "train.jsonl", ROWS)
    s = load("hf", 10, 3, id=str(tmp_path / "plain"), prompt="question", answer="reply")
    _check_loader_splits(s, 10, 3)


def test_loader_missing_column_lists_available(tmp_path):
    path = _write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(ValueError) as e:
        load("jsonl", 5, 2, path=path, prompt="instruction", answer="reply")
    msg = str(e.value)
    assert path in msg and "'instruction'" in msg and "params.prompt" in msg
    assert "available columns: question, reply, sys" in msg


def test_loader_missing_file(tmp_path):
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="nope.jsonl: file not found"):
        load("jsonl", 5, 2, path=missing, prompt="q", answer="a")
    with pytest.raises(ValueError, match="nope.parquet: file not found"):
        load("parquet", 5, 2, path=str(tmp_path / "nope.parquet"), prompt="q", answer="a")


def test_loader_empty_answer_and_skip_invalid(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[7]["reply"] = "  "
    path = _write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(ValueError, match=r"d\.jsonl: row 7: empty answer \(column 'reply'\)"):
        load("jsonl", 39, 1, path=path, prompt="question", answer="reply")
    s = load("jsonl", 38, 1, path=path, prompt="question", answer="reply", skip_invalid=True)
    assert all(e.meta["row"] != 7 for k in SPLITS for e in s[k])
    bad = [{"conversations": [{"from": "gpt", "value": "hi"}]}]
    with pytest.raises(ValueError, match="alternate user/assistant"):
        load("jsonl", 1, 0, path=_write_jsonl(tmp_path / "bad.jsonl", bad), messages="conversations")
    odd = [{"conversations": [{"from": "robot", "value": "hi"}]}]
    with pytest.raises(ValueError, match="unknown role 'robot'"):
        load("jsonl", 1, 0, path=_write_jsonl(tmp_path / "odd.jsonl", odd), messages="conversations")


def test_loader_duplicates_never_straddle_the_split_and_sizes_are_checked(tmp_path):
    rows = [{"q": f"q{i % 10}", "a": f"a{i % 10}"} for i in range(40)]  # every row four times
    path = _write_jsonl(tmp_path / "dup.jsonl", rows)
    s = load("jsonl", 20, 3, path=path, prompt="q", answer="a")
    assert not {e.prompt for e in s["train"]} & {e.prompt for e in s["heldout"]}
    with pytest.raises(ValueError, match="40 rows"):
        load("jsonl", 200, 3, path=path, prompt="q", answer="a")


def test_loader_params_need_a_mapping():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="prompt and answer"):
        get_recipe("jsonl").Params(path="x.jsonl", prompt="q")
    with pytest.raises(ValidationError, match="not both"):
        get_recipe("hf").Params(id="x", messages="m", prompt="q", answer="a")
