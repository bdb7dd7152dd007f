#!/usr/bin/python3
"""torch_decoder_bench.py - PyTorch's side of the generation rows of make
bench: the same Llama folder (config.json and model.safetensors, read
here), the same token ids and the same steps as `kinfer bench generate`,
with the same number of threads, in the folder's dtype (a BF16 folder
computes in bfloat16, as a PyTorch loop over it would).

Usage: torch_decoder_bench.py FOLDER THREADS PROMPT STEPS BATCHES
       BATCHES comma-separated, e.g. 1,32

The model is written out here (embedding, per layer RMSNorm, Q/K/V/O
projections with rotary positions and grouped-query attention over a
key/value cache preallocated per run, RMSNorm, SwiGLU feed-forward; final
norm and lm_head on each sequence's last token), in inference mode.
Prefill: one sequence's PROMPT tokens in one forward, best of 3. Decode,
per batch size B: B sequences prefilled together, then STEPS steps of one
token each; tokens/s of all sequences, the median of 3 runs.

Prints one `torch: key=value ...` line per phase, as the kinfer bench
commands do.
"""
import json
import math
import struct
import sys
import time

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load(folder):
    """The tensors of model.safetensors, by name."""
    with open(folder + "/model.safetensors", "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        buf = bytearray(raw[base + a:base + b])
        t = torch.frombuffer(buf, dtype=DTYPES[e["dtype"]]) if b > a else torch.empty(0)
        out[name] = t.reshape(e["shape"]).clone()  # its own aligned storage
    return out


def gen_id(seq, pos, vocab):
    """kinfer bench generate's ids (tools/bench_gen.c)."""
    return (seq * 104729 + pos * 7919 + 3) % vocab


class Llama:
    def __init__(self, folder):
        cfg = json.load(open(folder + "/config.json"))
        w = load(folder)
        self.H = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kvh = cfg.get("num_key_value_heads", self.heads)
        self.dh = cfg.get("head_dim", self.H // self.heads)
        self.L = cfg["num_hidden_layers"]
        self.vocab = cfg["vocab_size"]
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = cfg.get("rope_theta", 10000.0)
        self.w = w
        self.dtype = w["model.embed_tokens.weight"].dtype
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.dh, 2, dtype=torch.float64)
                                         / self.dh))
        self.head = w.get("lm_head.weight", w["model.embed_tokens.weight"])

    def rms(self, x, g):
        v = x.float()
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + self.eps)
        return g * v.to(x.dtype)

    def rope(self, x, pos):
        """x [B, h, T, dh] at positions pos [T]."""
        ang = pos.double()[:, None] * self.inv_freq[None, :]
        cos = torch.cat([ang.cos(), ang.cos()], -1).to(x.dtype)
        sin = torch.cat([ang.sin(), ang.sin()], -1).to(x.dtype)
        half = self.dh // 2
        rot = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * cos + rot * sin

    def cache(self, B, ctx):
        shape = (B, self.kvh, ctx, self.dh)
        return [(torch.zeros(shape, dtype=self.dtype), torch.zeros(shape, dtype=self.dtype))
                for _ in range(self.L)]

    def forward(self, ids, start, kv):
        """ids [B, T] at positions start .. start + T - 1; logits of the last."""
        B, T = ids.shape
        w, dh, g = self.w, self.dh, self.heads // self.kvh
        pos = torch.arange(start, start + T)
        x = torch.nn.functional.embedding(ids, w["model.embed_tokens.weight"])
        mask = None
        if T > 1:
            mask = torch.full((T, start + T), float("-inf")).triu(start + 1)
        for l in range(self.L):
            p = "model.layers.%d." % l
            h = self.rms(x, w[p + "input_layernorm.weight"])
            q = torch.nn.functional.linear(h, w[p + "self_attn.q_proj.weight"])
            k = torch.nn.functional.linear(h, w[p + "self_attn.k_proj.weight"])
            v = torch.nn.functional.linear(h, w[p + "self_attn.v_proj.weight"])
            q = self.rope(q.view(B, T, self.heads, dh).transpose(1, 2), pos)
            k = self.rope(k.view(B, T, self.kvh, dh).transpose(1, 2), pos)
            v = v.view(B, T, self.kvh, dh).transpose(1, 2)
            ck, cv = kv[l]
            ck[:, :, start:start + T] = k
            cv[:, :, start:start + T] = v
            K = ck[:, :, :start + T].repeat_interleave(g, dim=1)
            V = cv[:, :, :start + T].repeat_interleave(g, dim=1)
            s = (q @ K.transpose(-1, -2)).float() / math.sqrt(dh)
            if mask is not None:
                s = s + mask
            a = (torch.softmax(s, -1).to(V.dtype) @ V).transpose(1, 2).reshape(B, T, -1)
            x = x + torch.nn.functional.linear(a, w[p + "self_attn.o_proj.weight"])
            h = self.rms(x, w[p + "post_attention_layernorm.weight"])
            gt = torch.nn.functional.linear(h, w[p + "mlp.gate_proj.weight"])
            up = torch.nn.functional.linear(h, w[p + "mlp.up_proj.weight"])
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gt) * up,
                                               w[p + "mlp.down_proj.weight"])
        h = self.rms(x[:, -1], w["model.norm.weight"])
        return torch.nn.functional.linear(h, self.head)


def main():
    folder, threads, P, S = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    batches = [int(b) for b in sys.argv[5].split(",") if b]
    torch.set_num_threads(threads)
    m = Llama(folder)
    dt = str(m.dtype).replace("torch.", "")
    with torch.inference_mode():
        best = 0.0
        for _ in range(3):
            kv = m.cache(1, P + S)
            ids = torch.tensor([[gen_id(0, p, m.vocab) for p in range(P)]])
            t0 = time.perf_counter()
            m.forward(ids, 0, kv)
            best = max(best, P / (time.perf_counter() - t0))
        print("torch: phase=prefill threads=%d dtype=%s prompt=%d tokens_per_s=%.1f"
              % (threads, dt, P, best), flush=True)
        for B in batches:
            rates = []
            for _ in range(3):
                kv = m.cache(B, P + S)
                ids = torch.tensor([[gen_id(i, p, m.vocab) for p in range(P)] for i in range(B)])
                m.forward(ids, 0, kv)
                t0 = time.perf_counter()
                for s in range(S):
                    step = torch.tensor([[gen_id(i, P + s, m.vocab)] for i in range(B)])
                    m.forward(step, P + s, kv)
                rates.append(B * S / (time.perf_counter() - t0))
            rates.sort()
            print("torch: phase=decode threads=%d dtype=%s seqs=%d prompt=%d steps=%d "
                  "tokens_per_s=%.1f" % (threads, dt, B, P, S, rates[1]), flush=True)


if __name__ == "__main__":
    main()
