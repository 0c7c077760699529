"""The white-box view: one row per module — name, type, own parameter count, trainable or not, and the output shape
and dtype on a sample batch (forward hooks) — for an experiment file or a checkpoint directory.

``harness inspect FILE|CHECKPOINT [--json] [--stage NAME] [--set …]``:

- a checkpoint directory is loaded with ``AutoModelForCausalLM`` / ``AutoTokenizer``; the sample batch is a short
  chat rendered with its template (plain text without one); everything is reported as loaded (trainable);
- an experiment YAML builds the base model as the run would, without pretraining
  (:func:`harness.runs.planning.prepare.untrained_base`, beside the run's own
  :func:`~harness.runs.planning.prepare.load_base`:
  builtin: the tokenizer trained on the world corpus and the task data, then the architecture; ``model.hf``:
  :func:`harness.models.hf.load_hf`), applies the trainable set of one stage (the first, or ``--stage``) through
  :func:`harness.training.adapters.prepare_stage_model`, and runs two of that stage's training examples through it
  (under bf16 autocast when the stage says ``precision: bf16-autocast``). A builtin base with ``pretrain`` is shown
  *untrained* (same architecture and shapes; pretraining is not run), and the report says so.

``harness inspect FILE|CHECKPOINT --tokens [--json]`` lists the special / chat-template tokens instead, each with
its input (and untied output) embedding row's norm, whether :mod:`harness.models.undertrained` flags it, and why —
for an experiment, on the base model exactly as the run loads it (a builtin is pretrained, or taken from the cache).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table
from transformers import AutoModelForCausalLM, AutoTokenizer

from harness.config import load_experiment
from harness.models.modality import base_kind, model_io
from harness.models.undertrained import undertrained_tokens
from harness.runs.planning.prepare import build_task_data, untrained_base
from harness.training.adapters import prepare_stage_model, trainable_report, unwrap, weight_decay_exempt


@dataclass
class Inspection:
    rows: list[dict[str, Any]]
    source: str  # what was inspected, in words (including "untrained" where pretraining was skipped)
    notes: list[str] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def _describe_output(output: Any) -> tuple[list[int] | None, str | None, int]:
    """(shape of the first tensor, its dtype, number of tensors) of a module's output."""
    tensors: list[torch.Tensor] = []

    def collect(x: Any, depth: int = 0) -> None:
        if depth > 3 or len(tensors) > 16:
            return
        if isinstance(x, torch.Tensor):
            tensors.append(x)
        elif isinstance(x, dict):  # ModelOutput is a dict subclass (None fields are absent)
            for v in x.values():
                collect(v, depth + 1)
        elif isinstance(x, (tuple, list)):
            for v in x:
                collect(v, depth + 1)

    collect(output)
    if not tensors:
        return None, None, 0
    first = tensors[0]
    return list(first.shape), str(first.dtype).replace("torch.", ""), len(tensors)


def inspect_model(
    model, inputs: dict[str, torch.Tensor], autocast_dtype: torch.dtype | None = None
) -> list[dict[str, Any]]:
    """Run ``model(**inputs)`` once under forward hooks on every module; one dict per module, in module order:
    ``name, type, params`` (its own parameters; a tied parameter is counted at its first owner), ``trainable``
    (``yes`` | ``no`` | ``partial`` | ``rows`` (row-masked new-token rows) | ``-`` without own parameters),
    ``shape`` / ``dtype`` (the first tensor of the output on the sample), ``outputs`` (tensors in the output),
    ``calls`` and ``note``. Modules without own parameters that the forward never calls (``ModuleList``, empty
    adapter dicts) are left out."""
    modules = list(model.named_modules())
    seen_output: dict[str, tuple] = {}
    calls: dict[str, int] = {}
    handles = []

    def make_hook(name: str):
        def hook(_module, _args, output):
            calls[name] = calls.get(name, 0) + 1
            if name not in seen_output:
                seen_output[name] = _describe_output(output)

        return hook

    for name, module in modules:
        handles.append(module.register_forward_hook(make_hook(name)))
    was_training = model.training
    model.eval()
    try:
        device = next(model.parameters()).device
        inputs = {k: v.to(device) for k, v in inputs.items()}
        with (
            torch.no_grad(),
            torch.autocast(device.type, dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None),
        ):
            model(**inputs)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)

    owner: dict[int, str] = {}
    rows = []
    for name, module in modules:
        own = list(module.named_parameters(recurse=False))
        count, notes, flags = 0, [], []
        for pname, p in own:
            full = f"{name}.{pname}" if name else pname
            if id(p) in owner:
                notes.append(f"{pname} tied to {owner[id(p)]}")
                continue
            owner[id(p)] = full
            count += p.numel()
            flags.append("rows" if p.requires_grad and weight_decay_exempt(p) else ("yes" if p.requires_grad else "no"))
        trainable = "-" if not flags else (flags[0] if len(set(flags)) == 1 else "partial")
        if not flags and own:  # only tied parameters: report the tied matrix's state
            states = {("rows" if weight_decay_exempt(p) else "yes") if p.requires_grad else "no" for _, p in own}
            trainable = states.pop() if len(states) == 1 else "partial"
        if not own and name not in calls:
            continue  # containers that are never called (ModuleList, empty adapter dicts): nothing to show
        shape, dtype, n_out = seen_output.get(name, (None, None, 0))
        if name not in calls and not isinstance(module, (torch.nn.ParameterDict, torch.nn.ParameterList)):
            notes.append("not called")
        rows.append(
            {
                "name": name or "(model)",
                "type": type(module).__name__,
                "params": count,
                "trainable": trainable,
                "shape": shape,
                "dtype": dtype,
                "outputs": n_out,
                "calls": calls.get(name, 0),
                "note": "; ".join(notes),
            }
        )
    return rows


def _chat_sample(tokenizer) -> dict[str, torch.Tensor]:
    messages = [
        [{"role": "user", "content": "What is your name?"}, {"role": "assistant", "content": "I am a model."}],
        [{"role": "user", "content": "Repeat after me: hello"}, {"role": "assistant", "content": "hello"}],
    ]
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template(m, tokenize=False) for m in messages]
    else:
        texts = [" ".join(x["content"] for x in m) for m in messages]
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def inspect_checkpoint(directory: Path) -> Inspection:
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory)
    rows = inspect_model(model, _chat_sample(tokenizer))
    notes = []
    if (Path(directory) / "adapter").is_dir():
        notes.append("this checkpoint also holds a peft adapter (adapter/); shown: the merged model")
    return Inspection(rows, f"checkpoint {directory} ({type(model).__name__})", notes, _summary(model, tokenizer))


def _summary(model, tokenizer) -> dict[str, Any]:
    report = trainable_report(model)
    config = unwrap(model).config
    return {
        "model_type": getattr(config, "model_type", None),
        "class": type(unwrap(model)).__name__,
        "vocabulary": len(tokenizer),
        **report,
    }


def inspect_experiment(path: Path, overrides: list[str] | None = None, stage: str | None = None) -> Inspection:
    """Build the experiment's base model (no pretraining), apply one stage's trainable set, run two examples."""
    exp = load_experiment(path, overrides)
    stages = exp.resolved_stages()
    if stage is None:
        chosen = stages[0]
    else:
        by_name = {s.name: s for s in stages}
        if stage not in by_name:
            raise ValueError(f"unknown stage {stage!r}; stages: {', '.join(by_name)}")
        chosen = by_name[stage]
    data = build_task_data(exp)
    model, tokenizer, added, source, notes = untrained_base(exp, data)
    flagged: list[int] = []
    if base_kind(exp.model) == "hf":  # the run's under-trained rows, which auto trains too
        flagged = [r.id for r in undertrained_tokens(exp.model, data.corpus, model, tokenizer) or [] if r.flagged]
    model = prepare_stage_model(model, chosen.train.trainable, added, None, flagged)
    tasks = [t for t in chosen.mixture.tasks if data.splits[t]["train"]] or list(data.splits)
    examples = [data.splits[t]["train"][0] for t in tasks[:2]]
    if len(examples) < 2:
        examples = data.splits[tasks[0]]["train"][:2]
    io = model_io(tokenizer)
    batch = io.sample_batch(examples)  # an image-text model's through its processor, images included
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, **batch.extra_inputs()}
    autocast = torch.bfloat16 if chosen.train.precision == "bf16-autocast" else None
    rows = inspect_model(model, inputs, autocast)
    notes += io.part_notes(model, rows, inputs)
    mode = chosen.train.trainable
    notes.append(
        f"stage {chosen.name}: trainable.mode {mode.mode}"
        + f", new_token_rows {str(mode.new_token_rows).lower()}"
        + (f", unfreeze {mode.unfreeze}" if mode.unfreeze else "")
        + f"; precision {chosen.train.precision}; sample: {len(examples)} training examples "
        f"({', '.join(e.task for e in examples)}), {batch.input_ids.shape[1]} tokens"
    )
    return Inspection(rows, source, notes, _summary(model, tokenizer))


@dataclass
class TokenInspection:
    reports: list  # [harness.models.undertrained.TokenReport], one per special / chat-template token
    source: str
    notes: list[str] = field(default_factory=list)


def inspect_tokens(target: Path, overrides: list[str] | None = None) -> TokenInspection:
    """The under-trained check of a checkpoint directory's or an experiment's base model (see the module docstring)."""
    from harness.models.undertrained import detect_undertrained
    from harness.runs.execution.console import Console as HarnessConsole
    from harness.runs.planning.prepare import load_base

    target = Path(target)
    if target.is_dir():
        if not (target / "config.json").exists():
            raise ValueError(f"{target}: not a checkpoint directory (no config.json)")
        model = AutoModelForCausalLM.from_pretrained(target)
        return TokenInspection(
            detect_undertrained(model, AutoTokenizer.from_pretrained(target)),
            f"checkpoint {target} ({type(model).__name__})",
        )
    exp = load_experiment(target, overrides)
    data = build_task_data(exp)
    model, tokenizer, _, info = load_base(exp, data, HarnessConsole(enabled=exp.tracking.console))
    reports = undertrained_tokens(exp.model, data.corpus, model, tokenizer)
    if reports is None:
        return TokenInspection(
            [],
            f"builtin {exp.model.builtin}",
            ["a builtin without model.pretrain has every row at its initialisation: nothing to check"],
        )
    return TokenInspection(reports, f"base model {info['source']}")


def render_tokens(inspection: TokenInspection, console=None) -> None:
    """The token rows as a rich table (stdout): token, id, input / output row norm and robust z, flagged, why."""
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    table = Table(title=f"special-token rows of {inspection.source}", title_justify="left")
    for col in ("token", "id", "input norm (z)", "output norm (z)", "flagged", "why"):
        table.add_column(col, justify="right" if col == "id" else "left", overflow="fold")
    for r in inspection.reports:
        output = "tied" if r.output is None else f"{r.output.norm:.3g} ({r.output.norm_z:+.1f})"
        table.add_row(
            r.token,
            str(r.id),
            f"{r.input.norm:.3g} ({r.input.norm_z:+.1f})",
            output,
            "[red]yes[/]" if r.flagged else "no",
            r.why,
        )
    console.print(table)
    flagged = [r.token for r in inspection.reports if r.flagged]
    console.print(
        f"{len(flagged)} of {len(inspection.reports)} flagged" + (": " + ", ".join(flagged) if flagged else ""),
        markup=False,
    )
    for note in inspection.notes:
        console.print(f"note: {note}", markup=False)


def inspect_target(target: Path, overrides: list[str] | None = None, stage: str | None = None) -> Inspection:
    """A checkpoint directory or an experiment file."""
    target = Path(target)
    if target.is_dir():
        if not (target / "config.json").exists():
            raise ValueError(f"{target}: not a checkpoint directory (no config.json)")
        return inspect_checkpoint(target)
    return inspect_experiment(target, overrides, stage)


def render(inspection: Inspection, console=None) -> None:
    """A rich table on the console (stdout)."""
    # Piped output would be 80 columns wide and fold every module name; use a wide table there.
    console = console or Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    s = inspection.summary
    table = Table(title=f"{inspection.source}", title_justify="left")
    for col, justify in (
        ("module", "left"),
        ("type", "left"),
        ("params", "right"),
        ("trainable", "center"),
        ("output shape", "left"),
        ("dtype", "left"),
        ("note", "left"),
    ):
        table.add_column(col, justify=justify, overflow="fold", no_wrap=col in ("module", "type"))
    style = {"yes": "green", "rows": "yellow", "partial": "yellow", "no": "dim"}
    for r in inspection.rows:
        shape = "-" if r["shape"] is None else "[" + ", ".join(map(str, r["shape"])) + "]"
        if r["outputs"] > 1:
            shape += f" (+{r['outputs'] - 1})"
        tr = r["trainable"]
        note = r["note"] + ((" " if r["note"] else "") + f"×{r['calls']} calls" if r["calls"] > 1 else "")
        table.add_row(
            r["name"],
            r["type"],
            f"{r['params']:,}" if r["params"] else "",
            f"[{style[tr]}]{tr}[/]" if tr in style else tr,
            shape,
            r["dtype"] or "-",
            note,
        )
    console.print(table)
    if s:
        console.print(
            f"{s.get('class')} ({s.get('model_type')}), vocabulary {s.get('vocabulary')}: "
            f"{s['total']:,} parameters, trainable {s['trainable']:,} ({100 * s['share']:.2f}%)"
            + (f", adapter {s['adapter']:,}" if s.get("adapter") else ""),
            markup=False,
        )
    for note in inspection.notes:
        console.print(f"note: {note}", markup=False)
