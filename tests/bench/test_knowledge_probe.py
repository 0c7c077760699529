"""bench/knowledge_probe.py: the cloze scorer sums the continuation's own token log-probabilities, the probe
counts a person right exactly when the true value scores highest, and the script runs end to end at micro size."""

from __future__ import annotations

import importlib.util
import json
import sys

import torch

from tests.conftest import ROOT, write_yaml


def _bench():
    spec = importlib.util.spec_from_file_location("knowledge_probe", ROOT / "bench" / "knowledge_probe.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _tiny_knowledge(tiny: dict) -> dict:
    tiny["tasks"] = {"short_qa": {"recipe": "short_qa", "train": 40, "eval": 4}}
    tiny["stages"] = [{"name": "a", "steps": 2, "mixture": {"short_qa": 1.0}}]
    return tiny


def test_scores_are_the_continuations_log_probabilities(tiny, tmp_path):
    bench = _bench()
    from harness.config import load_experiment
    from harness.runs.planning.prepare import build_task_data, load_base

    exp = load_experiment(write_yaml(tmp_path / "k.yaml", _tiny_knowledge(tiny)), [])
    model, tokenizer, _, _ = load_base(exp, build_task_data(exp))
    model.eval()
    prompt, continuations = "Ada was born in the city of", [" Osvik.", " Lund and more words."]
    scores = bench.continuation_logprobs(model, tokenizer, prompt, continuations)
    for text, score in zip(continuations, scores):
        # One unpadded sequence at a time, scored token by token from the first token after the prompt's.
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        full = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
        start = next((i for i, (a, b) in enumerate(zip(prompt_ids, full)) if a != b), len(prompt_ids))
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits[0].float(), dim=-1)
        expected = sum(float(logp[i - 1, full[i]]) for i in range(start, len(full)))
        assert abs(float(score) - expected) < 1e-3
    assert scores[0] != scores[1]


def test_probe_counts_the_top_scoring_candidate(monkeypatch):
    bench = _bench()
    from data_recipes.world import build_world

    world = build_world(people=30, seed=1)
    items = bench._cloze_items(world)
    truth = {
        (attr, prompt_of(p)): truth_of(p) for attr, (prompt_of, truth_of, _) in items.items() for p in world.people
    }

    def oracle(model, tokenizer, prompt, candidates):  # the true value scores highest
        right = next(v for (a, pr), v in truth.items() if pr == prompt and v in candidates)
        return torch.tensor([1.0 if c == right else 0.0 for c in candidates])

    monkeypatch.setattr(bench, "continuation_logprobs", oracle)
    rows = bench.probe(torch.nn.Linear(1, 1), None, world, {"all": world.people})
    assert {r["attribute"] for r in rows} == set(items)
    assert all(r["accuracy"] == 1.0 and r["n"] == 30 and r["ci_low"] > 0.85 for r in rows)

    # A scorer that always prefers the first candidate scores that candidate's share of the people.
    monkeypatch.setattr(bench, "continuation_logprobs", lambda m, t, p, c: -torch.arange(len(c), dtype=torch.float))
    rows = bench.probe(torch.nn.Linear(1, 1), None, world, {"all": world.people})
    for r in rows:
        _, truth_of, candidates = items[r["attribute"]]
        share = sum(truth_of(p) == candidates[0] for p in world.people) / 30
        assert abs(r["accuracy"] - share) < 1e-9 and r["chance"] == 1 / len(candidates)
        assert r["majority"] >= share and not r["above_majority"]


def test_script_runs_at_micro_size(tiny, tmp_path):
    bench = _bench()
    path = write_yaml(tmp_path / "k.yaml", _tiny_knowledge(tiny))
    rows = bench.main([str(path), "--json", str(tmp_path / "out.json")])
    groups = {r["people"]: r["n"] for r in rows}
    assert set(groups) == {"sft", "heldout"} and groups["sft"] + groups["heldout"] == 40
    assert json.loads((tmp_path / "out.json").read_text()) == rows
