#!/usr/bin/python3
"""torch_nomic.py - the independent check of kinfer's NomicBERT encoder
(tests/test_arch_nomic.c): the model written out by hand in PyTorch as
NomicBertModel's modeling code defines it (Debian's python3-torch has no
transformers package, and the model's code is not part of transformers),
loaded with a folder's weights and run on a padded batch with an attention
mask, in float64.

Usage: torch_nomic.py FOLDER REQUEST.json > result.json
request: {"rows": [[ids...], ...], "type_ids": [[...], ...] or null,
          "pooling": "cls"|"mean"|"max"|"none", "normalize": bool}
result:  {"output": [[...], ...]} (a row per sequence, or per token for
          pooling none)

What is the model's definition here, not kinfer's:
  - embeddings: word + token type (no position table), emb_ln;
  - the fused Wqkv split into q, k, v; rotary embeddings as the
    non-interleaved rotate_half form, inv_freq = 1 / base^(arange(0, dh,
    2) / dh) computed in float32 as the model does, positions arange(L);
  - scaled dot-product attention with the padding masked out, out_proj,
    post-LayerNorm (norm1, norm2), the gated MLP fc2(fc11(x) *
    silu(fc12(x)));
  - pooling over the non-padding tokens, F.normalize.
"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_st import read_safetensors  # tests/ is on sys.path

D = torch.float64


def cfg_get(cfg, key, alias, default=None):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    return cfg.get(alias, default)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def linear(w, x, name):
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def run(folder, req):
    with open(folder + "/config.json") as f:
        cfg = json.load(f)
    w = {(k[len("bert."):] if k.startswith("bert.") else k): v
         for k, v in read_safetensors(folder + "/model.safetensors").items()}
    H = cfg_get(cfg, "n_embd", "hidden_size")
    heads = cfg_get(cfg, "n_head", "num_attention_heads")
    layers = cfg_get(cfg, "n_layer", "num_hidden_layers")
    eps = cfg_get(cfg, "layer_norm_epsilon", "layer_norm_eps", 1e-12)
    base = cfg.get("rotary_emb_base", 10000)
    dh = H // heads
    rows = req["rows"]
    n, L = len(rows), max(len(r) for r in rows)
    ids = torch.zeros(n, L, dtype=torch.long)
    types = torch.zeros(n, L, dtype=torch.long)
    mask = torch.zeros(n, L, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = True
        if req.get("type_ids"):
            types[i, :len(r)] = torch.tensor(req["type_ids"][i])
    x = F.embedding(ids, w["embeddings.word_embeddings.weight"])
    x = x + F.embedding(types, w["embeddings.token_type_embeddings.weight"])
    x = F.layer_norm(x, (H,), w["emb_ln.weight"], w["emb_ln.bias"], eps)
    inv = 1.0 / (base ** (torch.arange(0, dh, 2, dtype=torch.float32) / dh))
    ang = torch.outer(torch.arange(L, dtype=torch.float32).to(D), inv.to(D))
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    bias = torch.zeros(n, 1, 1, L, dtype=D).masked_fill(~mask[:, None, None, :], float("-inf"))
    for li in range(layers):
        p = "encoder.layers.%d." % li
        qkv = linear(w, x, p + "attn.Wqkv").view(n, L, 3, heads, dh)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))  # [n, heads, L, dh]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        s = q @ k.transpose(-1, -2) / dh ** 0.5 + bias
        ctx = (s.softmax(-1) @ v).transpose(1, 2).reshape(n, L, H)
        x = F.layer_norm(x + linear(w, ctx, p + "attn.out_proj"), (H,), w[p + "norm1.weight"],
                         w[p + "norm1.bias"], eps)
        h = linear(w, x, p + "mlp.fc11") * F.silu(linear(w, x, p + "mlp.fc12"))
        x = F.layer_norm(x + linear(w, h, p + "mlp.fc2"), (H,), w[p + "norm2.weight"],
                         w[p + "norm2.bias"], eps)
    pool = req["pooling"]
    out = []
    for i, r in enumerate(rows):
        t = x[i, :len(r)]
        if pool == "none":
            y = t
        elif pool == "cls":
            y = t[0:1]
        elif pool == "mean":
            y = t.mean(0, keepdim=True)
        else:
            y = t.max(0, keepdim=True).values
        if req["normalize"]:
            y = F.normalize(y, dim=-1)
        out.extend(y.tolist())
    return {"output": out}


def main():
    folder, reqp = sys.argv[1], sys.argv[2]
    with open(reqp) as f:
        req = json.load(f)
    with torch.no_grad():
        json.dump(run(folder, req), sys.stdout)


if __name__ == "__main__":
    main()
