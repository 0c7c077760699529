"""Does the pretrained base know the world? A multiple-choice cloze probe of every person's facts, before SFT.

The knowledge tasks (``short_qa``, ``assistant_qa``, ``yesno``) ask about held-out people whose facts the base saw
only in pretraining; SFT can unlock that knowledge only if the base holds it. For each person and attribute this
probe scores every candidate value as a continuation of a corpus-style cloze prompt (``"{name} was born in the
city of"`` → ``" Osvik."``: the sum of the continuation's token log-probabilities) and counts the person right when
the true value scores highest. Chance is one over the number of candidates; the majority baseline is the most
common value's share. Accuracy is reported per attribute, for the people SFT trains on and the held-out people
separately, with the count and a 95 % Wilson interval.

The probe is hand-written (no library scores cloze candidates over this synthetic world); intervals come from
:mod:`harness.core.stats`. The base comes from the harness's own cache (``harness.runs.planning.prepare.load_base``:
trained on a miss).

Run from the repository root::

    python bench/knowledge_probe.py experiments/quickstart.yaml
    python bench/knowledge_probe.py experiments/quickstart.yaml --set model.pretrain.steps=1600 --json out.json
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from data_recipes.knowledge import KnowledgeRecipe
from data_recipes.world import Person, article
from harness.config import load_experiment
from harness.core.stats import wilson_interval
from harness.runs.planning.prepare import build_task_data, load_base


def _cloze_items(world) -> dict[str, tuple[Callable[[Person], str], Callable[[Person], str], list[str]]]:
    """attribute -> (prompt of a person, true continuation of a person, every candidate continuation). The prompts
    follow the pretraining corpus's own phrasings (data_recipes/world.py ``_FACTS``)."""
    years = [str(y) for y in sorted({p.birth_year for p in world.people})]
    pets = [f" has a pet {v}." for v in world.pets] + [" has no pet."]
    return {
        "birth_city": (
            lambda p: f"{p.name} was born in the city of",
            lambda p: f" {p.birth_city}.",
            [f" {c}." for c in world.cities],
        ),
        "birth_year": (
            lambda p: f"{p.name} was born in the year",
            lambda p: f" {p.birth_year}.",
            [f" {y}." for y in years],
        ),
        "job": (
            lambda p: f"{p.name} earns a living as",
            lambda p: f" {article(p.job)} {p.job}.",
            [f" {article(j)} {j}." for j in world.jobs],
        ),
        "home_city": (
            lambda p: f"The home city of {p.name} is",
            lambda p: f" {p.home_city}.",
            [f" {c}." for c in world.cities],
        ),
        "favourite_colour": (
            lambda p: f"The favourite colour of {p.name} is",
            lambda p: f" {p.favourite_colour}.",
            [f" {c}." for c in world.colours],
        ),
        "pet": (lambda p: p.name, lambda p: f" has a pet {p.pet}." if p.pet else " has no pet.", pets),
    }


@torch.no_grad()
def continuation_logprobs(model, tokenizer, prompt: str, continuations: list[str]) -> torch.Tensor:
    """Sum of log-probabilities of each continuation's tokens after ``prompt`` (one padded batch)."""
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    rows = []
    for text in continuations:
        full = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
        # Tokens are scored from where the prompt's own tokens stop agreeing with the joint encoding (a merge
        # across the boundary would otherwise hide part of the continuation).
        start = next((i for i, (a, b) in enumerate(zip(prompt_ids, full)) if a != b), len(prompt_ids))
        rows.append((full, max(start, 1)))
    width = max(len(full) for full, _ in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for k, (full, _) in enumerate(rows):
        ids[k, : len(full)] = torch.tensor(full)
        mask[k, : len(full)] = 1
    device = next(model.parameters()).device
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float().cpu()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    scores = torch.zeros(len(rows))
    for k, (full, start) in enumerate(rows):
        scores[k] = logp[k, start - 1 : len(full) - 1].sum()
    return scores


def probe(model, tokenizer, world, people: dict[str, list[Person]]) -> list[dict[str, Any]]:
    """One row per (people group, attribute): accuracy with n and interval, chance, majority baseline."""
    model.eval()
    rows = []
    for attribute, (prompt_of, truth_of, candidates) in _cloze_items(world).items():
        for group, members in people.items():
            right = 0
            for person in members:
                scores = continuation_logprobs(model, tokenizer, prompt_of(person), candidates)
                right += candidates[int(scores.argmax())] == truth_of(person)
            majority = Counter(truth_of(p) for p in members).most_common(1)[0][1] / len(members)
            ci = wilson_interval(right, len(members))
            rows.append(
                {
                    "attribute": attribute,
                    "people": group,
                    "accuracy": ci.estimate,
                    "n": ci.n,
                    "ci_low": ci.low,
                    "ci_high": ci.high,
                    "chance": 1 / len(candidates),
                    "majority": majority,
                    "above_majority": ci.low > majority,
                }
            )
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment", type=Path)
    parser.add_argument("--set", action="append", default=[], help="override: key.path=value (repeatable)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args(argv)
    exp = load_experiment(args.experiment, args.set)
    data = build_task_data(exp)
    model, tokenizer, _, info = load_base(exp, data)
    knowledge = [r for r in data.recipes.values() if isinstance(r, KnowledgeRecipe)]
    if not knowledge:
        raise SystemExit(f"{args.experiment}: no knowledge task (short_qa, assistant_qa, yesno): nothing to probe")
    train_people, heldout_people = knowledge[0].people()  # the split SFT uses (it depends only on the world)
    rows = probe(model, tokenizer, knowledge[0].world, {"sft": train_people, "heldout": heldout_people})
    print(
        f"base: {info.get('source')} (pretrain final loss {info.get('pretrain_final_loss')}, "
        f"cache {info.get('cache_dir')})"
    )
    for r in rows:
        print(
            f"{r['attribute']:>16} {r['people']:>7}: {r['accuracy']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] "
            f"n={r['n']}  chance {r['chance']:.3f}  majority {r['majority']:.3f}"
            + ("  above majority" if r["above_majority"] else "")
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
