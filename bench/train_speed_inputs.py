"""The inputs every run of ``bench/train_speed.py`` shares: the bench's experiment (eight recipes, one stage), the
tokenizer, initial weights and encoded pools the parent writes once to a work directory, and the loaders each child
process reads them back with. Not a script: ``bench/train_speed.py`` imports it.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

# A Qwen2.5-0.5B-shaped config (random weights; nothing is downloaded): the published config's sizes.
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
)
QWEN25_05B_VOCAB = 151936


def experiment(args) -> dict:
    """The bench as a harness experiment: eight recipes × 500 examples, one stage, one pass (natural mixture)."""

    def task(recipe, **params):
        return {"recipe": recipe, "train": 500, "eval": 1, "params": params}

    model = {"builtin": "qwen2-tiny"}
    if args.model == "qwen2.5-0.5b-shape":
        model["config"] = dict(QWEN25_05B)
    elif args.hidden:  # the default model made wider: how close to the limit depends on width
        model["config"] = dict(
            hidden_size=args.hidden,
            intermediate_size=4 * args.hidden,
            num_attention_heads=args.hidden // 32,
            num_key_value_heads=2,
        )
    return {
        "name": "train_speed",
        "seed": 0,
        "world": {"people": 300, "seed": 0},
        "model": model,
        "tasks": {
            "repeat": task("repeat", max_words=8),
            "identity": task("identity", name="Shengoovlei"),
            "yesno": task("yesno"),
            "short_qa": task("short_qa"),
            "assistant_qa": task("assistant_qa", turns=2),
            "math": task("math_reversed", digits=3),
            "spell": task("spell"),
            "count": task("count"),
        },
        # The harness's defaults: no length grouping (it slows learning, bench/plain_vs_harness.py), packing auto;
        # the configurations of bench/train_speed.py change them (harness-grouped: window 50, no packing).
        "train": {
            "batch_size": args.batch_size,
            "max_length": 81,
            "precision": "bf16-autocast" if args.device == "cuda" else "fp32",
            "optim": {
                "lr": 1e-3,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.0,
                "warmup": 0,
                "schedule": "constant",
                "grad_clip": 1.0,
            },
        },
        "eval": {"splits": ["heldout"]},
        "stages": [{"name": "bench", "steps": args.steps, "mixture": "natural"}],
        "tracking": {"wandb": {"mode": "disabled"}, "console": False},
    }


# ----------------------------------------------------------------------------------------------------------------
# Shared inputs: written once by the parent, read by every child
# ----------------------------------------------------------------------------------------------------------------


def prepare(workdir: Path, args) -> dict:
    """Tokenizer, initial weights and encoded pools (the harness's own builders), saved under ``workdir``."""
    import torch

    from harness.config import validate_data
    from harness.runs.planning.prepare import build_task_data, encode_task_data, load_base

    exp_dict = experiment(args)
    exp = validate_data(exp_dict)
    data = build_task_data(exp)
    model, tokenizer, _, _ = load_base(exp, data)
    if args.model == "qwen2.5-0.5b-shape":
        model.resize_token_embeddings(QWEN25_05B_VOCAB, mean_resizing=False)
    encoded = encode_task_data(exp, data, tokenizer)
    model.to("cpu").save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "tokenizer")
    (workdir / "pools.pkl").write_bytes(pickle.dumps(encoded.train))
    (workdir / "experiment.json").write_text(json.dumps(exp_dict))
    lengths = sorted(e.length for pool in encoded.train.values() for e in pool)
    kept = [n for n in lengths if n <= exp.train.max_length]
    del model
    torch.set_num_threads(torch.get_num_threads())
    return {
        "examples": len(kept),
        "dropped": len(lengths) - len(kept),
        "min": kept[0],
        "max": kept[-1],
        "median": kept[len(kept) // 2],
        "mean": sum(kept) / len(kept),
    }


def load_inputs(workdir: Path, overrides: dict | None = None):
    from harness.config import validate_data

    exp_dict = json.loads((workdir / "experiment.json").read_text())
    exp_dict["train"].update(overrides or {})
    exp = validate_data(exp_dict)
    pools = pickle.loads((workdir / "pools.pkl").read_bytes())
    return exp, pools


def load_model(workdir: Path, device: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(workdir / "model", attn_implementation="sdpa").to(device)
    return model, AutoTokenizer.from_pretrained(workdir / "tokenizer")


def quiet() -> None:
    import warnings

    import transformers

    warnings.filterwarnings("ignore")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass
