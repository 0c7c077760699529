"""GPU speed: a Qwen2.5-0.5B-shaped model built from its config (random weights, no download), trained under bf16
autocast — full fine-tuning and LoRA (r=16 on every linear layer) — on every visible GPU in turn, printing tokens/s
and MFU against the device's dense bf16 peak. A plain PyTorch loop (the hardware's ceiling for this shape); the
harness's own data-parallel path on GPUs is checked by ``bench/gpu_check.py``.

    python bench/gpu_speed.py                  # about a minute per GPU
    python bench/gpu_speed.py --steps 20 --seq 1024

MFU counts 6·N FLOPs per token for full training and 4·N for LoRA (no weight gradients of frozen matrices; the
adapters' own FLOPs are negligible), attention FLOPs left out — the usual approximation (PaLM, appendix B).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

# Qwen/Qwen2.5-0.5B's config.json (the shape; weights are random).
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1e6,
    tie_word_embeddings=True,
    rms_norm_eps=1e-6,
)
# Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched on the device name.
BF16_PEAK = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10": 125e12,
    "4090": 165e12,
    "3090": 71e12,
    "V100": 125e12,
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peak_of(name: str) -> float | None:
    return next((v for k, v in BF16_PEAK.items() if k in name), None)


def build(device, lora: bool):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN25_05B, attn_implementation="sdpa")).to(device)
    if lora:
        from peft import LoraConfig, get_peft_model  # optional import: only the LoRA measurement needs peft

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=LORA_TARGETS))
    return model


def measure(device, lora: bool, batch: int, seq: int, steps: int, warmup: int = 3) -> dict:
    model = build(device, lora)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    ids = torch.randint(0, QWEN25_05B["vocab_size"], (batch, seq), device=device)
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize(device)
            started = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    tokens_s = batch * seq * steps / (time.perf_counter() - started)
    peak = peak_of(torch.cuda.get_device_name(device))
    flops = (4 if lora else 6) * n_params * tokens_s
    del model, opt
    torch.cuda.empty_cache()
    return {
        "tokens_s": tokens_s,
        "mfu": flops / peak if peak else None,
        "loss": float(loss),
        "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no GPU visible: nothing to measure")
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.device_count()} GPU(s); batch {args.batch} × {args.seq} tokens")
    for i in range(torch.cuda.device_count()):
        name = torch.cuda.get_device_name(i)
        for lora in (False, True):
            r = measure(torch.device("cuda", i), lora, args.batch, args.seq, args.steps)
            mfu = f"{100 * r['mfu']:.1f} %" if r["mfu"] is not None else "n/a (unknown peak)"
            print(
                f"cuda:{i} {name}: {'lora' if lora else 'full'}: {r['tokens_s']:,.0f} tokens/s, MFU {mfu}, "
                f"peak memory {r['peak_mem_gib']:.1f} GiB, loss {r['loss']:.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
