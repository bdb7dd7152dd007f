#!/usr/bin/python3
"""torch_decoder.py - the independent check of kinfer's Llama-family
decoders (tests/test_decoder.c): the model written out by hand in PyTorch,
module for module as Hugging Face's modeling_llama.py, modeling_mistral.py,
modeling_qwen2.py and modeling_qwen3.py define it (Debian's python3-torch
1.13 has no transformers package), loaded with a folder's weights (one
model.safetensors or the shards of model.safetensors.index.json), run on
one prompt with the causal mask.

Usage: torch_decoder.py FOLDER REQUEST.json [FOLDER REQUEST.json ...] > results.json

request: {"ids": [int, ...]}; result: {"logits": [[float] * vocab] * len(ids)}.
Float64 throughout, except where Hugging Face computes in float32: the
rotary inverse frequencies (rope_init_fn: default, linear, llama3, in
float32 as modeling_rope_utils computes them).

What is Hugging Face's here, not kinfer's:
  - LlamaRMSNorm (variance in the input's dtype, weight * normalized);
  - the rotary embedding: inv_freq from rope_theta and rope_scaling
    ("linear": divided by factor; "llama3": low/high frequency bands and
    the smooth blend), cos/sin of position x inv_freq duplicated over the
    two halves, rotate_half;
  - Qwen3's q_norm/k_norm applied per head before the rotary embedding;
  - Qwen2's biases on q, k, v (attention_bias for Llama: on o too);
  - repeat_kv for grouped-query attention, the causal mask, softmax in
    float32 upcast (a no-op in float64), o_proj;
  - the SwiGLU MLP down(act(gate(x)) * up(x)), residuals, the final norm
    and lm_head or the tied embedding table.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from torch_st import read_safetensors  # tests/ is on sys.path

D = torch.float64


def read_weights(folder):
    out = {}
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        read_safetensors(single, out)
        return out
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        index = json.load(f)
    for shard in sorted(set(index["weight_map"].values())):
        read_safetensors(os.path.join(folder, shard), out)
    return out


def rope_inv_freq(cfg, dim):
    """modeling_rope_utils: _compute_default / _linear / _llama3 parameters."""
    base = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    rs = cfg.get("rope_scaling")
    if not rs:
        return inv
    kind = rs.get("rope_type", rs.get("type"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor = rs["factor"]
        low, high = rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wave, high_wave = old / low, old / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wave, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wave) * ~(wavelen > low_wave)
        return torch.where(medium, smoothed, inv_l)
    raise ValueError("rope_scaling %r" % kind)


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def forward(folder, ids):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    w = read_weights(folder)
    mt = cfg["model_type"]
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    dh = cfg.get("head_dim") or H // nh
    eps = cfg.get("rms_norm_eps", 1e-6)
    attn_bias = cfg.get("attention_bias", False)
    qkv_bias = mt == "qwen2" or attn_bias
    o_bias = mt != "qwen2" and attn_bias
    mlp_bias = cfg.get("mlp_bias", False)

    def lin(x, name, bias):
        return F.linear(x, w[name + ".weight"], w[name + ".bias"] if bias else None)

    T = len(ids)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)].unsqueeze(0)  # [1, T, H]
    inv = rope_inv_freq(cfg, dh)
    pos = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(pos, inv)  # float32, as Hugging Face computes it
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(D), emb.sin().to(D)
    mask = torch.full((T, T), float("-inf"), dtype=D).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = lin(h, p + "self_attn.q_proj", qkv_bias).view(1, T, nh, dh)
        k = lin(h, p + "self_attn.k_proj", qkv_bias).view(1, T, nkv, dh)
        v = lin(h, p + "self_attn.v_proj", qkv_bias).view(1, T, nkv, dh)
        if mt == "qwen3":
            q = rms_norm(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = q @ k.transpose(2, 3) / math.sqrt(dh) + mask
        a = torch.softmax(s, dim=-1) @ v  # [1, nh, T, dh]
        a = a.transpose(1, 2).reshape(1, T, nh * dh)
        x = x + lin(a, p + "self_attn.o_proj", o_bias)
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        g = lin(h, p + "mlp.gate_proj", mlp_bias)
        u = lin(h, p + "mlp.up_proj", mlp_bias)
        x = x + lin(F.silu(g) * u, p + "mlp.down_proj", mlp_bias)
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight")
    if head is None:
        head = w["model.embed_tokens.weight"]
    return F.linear(x, head)[0]


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: torch_decoder.py FOLDER REQUEST [FOLDER REQUEST ...]")
    results = []
    with torch.no_grad():
        for folder, path in zip(args[0::2], args[1::2]):
            with open(path) as f:
                req = json.load(f)
            results.append({"logits": forward(folder, req["ids"]).tolist()})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
