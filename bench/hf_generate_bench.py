#!/usr/bin/env python3
"""hf_generate_bench.py - Hugging Face transformers' side of the GPU
generation rows of make bench: the same Llama folder (config.json and
model.safetensors, as `kinfer model demo --kind llama` writes it), the
same token ids and the same number of steps as `kinfer bench generate`,
on the GPU through `model.generate()` (greedy, a static number of new
tokens: min_new_tokens = max_new_tokens, no early stop), in bfloat16.

Usage: hf_generate_bench.py FOLDER PROMPT STEPS BATCHES
       BATCHES comma-separated, e.g. 1,32,256

Prefill: one sequence's PROMPT tokens in one forward, best of 3. Decode,
per batch size B: B prompts of PROMPT tokens (the ids of
tools/bench_gen.c), generate() of STEPS + 1 new tokens timed, minus the
same batch's prefill alone (a forward over the prompts, timed the same
way), over B x STEPS tokens: the decode tokens/s, the median of 3 runs.
CUDA is synchronized around every timed region.

Prints one `hf: key=value ...` line per phase, as the kinfer bench
commands do. Needs torch with CUDA and transformers (the GPU machine has
both); never a dependency of kinfer.
"""
import statistics
import sys
import time

import torch
import transformers


def gen_id(seq, pos, vocab):
    """kinfer bench generate's ids (tools/bench_gen.c)."""
    return (seq * 104729 + pos * 7919 + 3) % vocab


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main():
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    folder, prompt, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    batches = [int(b) for b in sys.argv[4].split(",") if b]
    dev = torch.device("cuda")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, torch_dtype=torch.bfloat16).to(dev).eval()
    vocab = model.config.vocab_size
    name = torch.cuda.get_device_name(dev).replace('"', "'")

    def ids_for(b):
        rows = [[gen_id(i, p, vocab) for p in range(prompt)] for i in range(b)]
        return torch.tensor(rows, dtype=torch.long, device=dev)

    with torch.inference_mode():
        one = ids_for(1)
        model(one)  # warm-up
        best = min(timed(lambda: model(one))[0] for _ in range(3))
        print(f"hf: phase=prefill transformers={transformers.__version__} "
              f"torch={torch.__version__} prompt={prompt} tokens_per_s={prompt / best:.1f} "
              f"device=\"{name}\"", flush=True)
        for b in batches:
            ids = ids_for(b)
            mask = torch.ones_like(ids)
            kw = dict(attention_mask=mask, do_sample=False, max_new_tokens=steps + 1,
                      min_new_tokens=steps + 1, pad_token_id=0)
            model.generate(ids, **kw)  # warm-up
            rates = []
            for _ in range(3):
                pre, _ = timed(lambda: model(ids, attention_mask=mask))
                total, out = timed(lambda: model.generate(ids, **kw))
                assert out.shape[1] == prompt + steps + 1, out.shape
                rates.append(b * steps / max(total - pre, 1e-9))
            print(f"hf: phase=decode seqs={b} prompt={prompt} steps={steps} "
                  f"tokens_per_s={statistics.median(rates):.1f} device=\"{name}\"", flush=True)


if __name__ == "__main__":
    main()
