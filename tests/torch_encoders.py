#!/usr/bin/python3
"""torch_encoders.py - the independent check of kinfer's RoBERTa, MPNet
and DistilBERT encoders (tests/test_arch_encoders.c): each family's model
written out by hand in PyTorch, module for module as Hugging Face's
modeling_roberta.py, modeling_mpnet.py and modeling_distilbert.py define
them (Debian's python3-torch 1.13 has no transformers package), loaded
with a folder's weights, and run on a padded batch with an attention mask.

Usage: torch_encoders.py FOLDER REQUEST.json [FOLDER REQUEST.json ...] > results.json

request and result: as tests/torch_encoder.py (rows, type_ids, pooling,
normalize, head, sigmoid; here also scores: "softmax", "sigmoid" or "none"
-> {"output": [[...], ...]}); the family comes
from config.json's model_type. Float64 throughout.

What is Hugging Face's here, not kinfer's:
  - positions: RoBERTa's and MPNet's create_position_ids_from_input_ids
    (cumsum of the non-padding mask, plus the padding id; padding tokens
    get the padding id), the padding id being config.pad_token_id for
    RoBERTa and 1 for MPNet (MPNetEmbeddings fixes it); DistilBERT's
    arange, and its sinusoidal table (create_sinusoidal_embeddings) when
    the file has none;
  - MPNet's relative_position_bucket verbatim (float32 log, as PyTorch
    runs it) over arange positions, the bias added after the 1/sqrt(dh)
    scaling and before the mask, shared by every layer;
  - the extended attention mask (finfo.min where padding), softmax,
    post-LayerNorm layers;
  - the heads: RobertaClassificationHead / MPNetClassificationHead (dense,
    tanh, out_proj on the first token), DistilBERT's pre_classifier, ReLU,
    classifier.
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

from torch_st import read_safetensors  # tests/ is on sys.path

D = torch.float64


class Weights:
    """A state dict looked up with or without the family's prefix."""

    def __init__(self, ts, prefix):
        self.ts, self.prefix = ts, prefix

    def has(self, name):
        return name in self.ts or self.prefix + name in self.ts

    def __call__(self, name):
        if name in self.ts:
            return self.ts[name]
        return self.ts[self.prefix + name]

    def linear(self, x, module):
        return F.linear(x, self(module + ".weight"), self(module + ".bias"))

    def layernorm(self, x, module, eps):
        return F.layer_norm(x, (x.shape[-1],), self(module + ".weight"), self(module + ".bias"),
                            eps)


def act_fn(name):
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu":
        return F.relu
    raise ValueError("activation " + name)


def create_position_ids_from_input_ids(input_ids, padding_idx):
    """modeling_roberta.py's (and modeling_mpnet.py's)."""
    mask = input_ids.ne(padding_idx).int()
    incremental_indices = torch.cumsum(mask, dim=1).type_as(mask) * mask
    return incremental_indices.long() + padding_idx


def relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
    """MPNetEncoder.relative_position_bucket, verbatim."""
    ret = 0
    n = -relative_position
    num_buckets //= 2
    ret += (n < 0).to(torch.long) * num_buckets
    n = torch.abs(n)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)).to(torch.long)
    val_if_large = torch.min(val_if_large, torch.full_like(val_if_large, num_buckets - 1))
    ret += torch.where(is_small, n, val_if_large)
    return ret


def sinusoidal(n_pos, dim):
    """create_sinusoidal_embeddings of modeling_distilbert.py."""
    enc = torch.tensor([[pos / math.pow(10000, 2 * (j // 2) / dim) for j in range(dim)]
                        for pos in range(n_pos)], dtype=D)
    out = torch.zeros(n_pos, dim, dtype=D)
    out[:, 0::2] = torch.sin(enc[:, 0::2])
    out[:, 1::2] = torch.cos(enc[:, 1::2])
    return out


class Family:
    """One family's names and config keys."""

    def __init__(self, cfg):
        mt = cfg["model_type"]
        self.kind = "distilbert" if mt == "distilbert" else "mpnet" if mt == "mpnet" else \
            "roberta"
        if self.kind == "distilbert":
            self.prefix, self.layer = "distilbert.", "transformer.layer.%d."
            self.mods = ["attention.q_lin", "attention.k_lin", "attention.v_lin",
                         "attention.out_lin", "sa_layer_norm", "ffn.lin1", "ffn.lin2",
                         "output_layer_norm"]
            self.H, self.L, self.nh = cfg["dim"], cfg["n_layers"], cfg["n_heads"]
            self.eps, self.act = 1e-12, cfg.get("activation", "gelu")
        else:
            self.prefix = self.kind + "."
            self.layer = "encoder.layer.%d."
            if self.kind == "mpnet":
                self.mods = ["attention.attn.q", "attention.attn.k", "attention.attn.v",
                             "attention.attn.o", "attention.LayerNorm", "intermediate.dense",
                             "output.dense", "output.LayerNorm"]
            else:
                self.mods = ["attention.self.query", "attention.self.key",
                             "attention.self.value", "attention.output.dense",
                             "attention.output.LayerNorm", "intermediate.dense",
                             "output.dense", "output.LayerNorm"]
            self.H, self.L = cfg["hidden_size"], cfg["num_hidden_layers"]
            self.nh = cfg["num_attention_heads"]
            self.eps, self.act = cfg.get("layer_norm_eps", 1e-12), cfg.get("hidden_act", "gelu")
        self.pad = cfg.get("pad_token_id", 1) if self.kind == "roberta" else 1


def forward(folder, rows, types):
    """The last hidden states [n, L, H] of the rows as one right-padded
    batch, the padding mask [n, L] (True = padding) and the weights."""
    cfg = json.load(open(folder + "/config.json"))
    fam = Family(cfg)
    w = Weights(read_safetensors(folder + "/model.safetensors"), fam.prefix)
    n, L = len(rows), max(len(r) for r in rows)
    pad_id = fam.pad if fam.kind != "distilbert" else cfg.get("pad_token_id", 0)
    ids = torch.full((n, L), pad_id, dtype=torch.long)
    tys = torch.zeros(n, L, dtype=torch.long)
    mask = torch.zeros(n, L, dtype=D)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r)
        if types:
            tys[i, :len(r)] = torch.tensor(types[i])
        mask[i, :len(r)] = 1
    H, nh = fam.H, fam.nh
    dh = H // nh
    with torch.no_grad():
        x = F.embedding(ids, w("embeddings.word_embeddings.weight"))
        if fam.kind == "distilbert":
            pos_ids = torch.arange(L).unsqueeze(0).expand(n, L)
            table = w("embeddings.position_embeddings.weight") \
                if w.has("embeddings.position_embeddings.weight") \
                else sinusoidal(cfg["max_position_embeddings"], H)
        else:
            pos_ids = create_position_ids_from_input_ids(ids, fam.pad)
            table = w("embeddings.position_embeddings.weight")
        x = x + F.embedding(pos_ids, table)
        if fam.kind == "roberta":
            x = x + F.embedding(tys, w("embeddings.token_type_embeddings.weight"))
        x = w.layernorm(x, "embeddings.LayerNorm", fam.eps)
        ext = (1.0 - mask[:, None, None, :]) * torch.finfo(D).min
        bias = 0
        if fam.kind == "mpnet":
            ctx = torch.arange(L, dtype=torch.long)[:, None]
            mem = torch.arange(L, dtype=torch.long)[None, :]
            bucket = relative_position_bucket(mem - ctx)
            bias = F.embedding(bucket, w("encoder.relative_attention_bias.weight"))
            bias = bias.permute([2, 0, 1]).unsqueeze(0)
        act = act_fn(fam.act)
        for li in range(fam.L):
            p = fam.layer % li
            q, k, v, o, ln1, f1, f2, ln2 = [p + m for m in fam.mods]

            def heads(t):
                return t.view(n, L, nh, dh).permute(0, 2, 1, 3)

            Q, K, V = heads(w.linear(x, q)), heads(w.linear(x, k)), heads(w.linear(x, v))
            if fam.kind == "distilbert":
                Q = Q / math.sqrt(dh)
                scores = Q @ K.transpose(-1, -2)
            else:
                scores = Q @ K.transpose(-1, -2) / math.sqrt(dh)
            scores = scores + bias + ext
            probs = torch.softmax(scores, dim=-1)
            c = (probs @ V).permute(0, 2, 1, 3).reshape(n, L, H)
            x = w.layernorm(w.linear(c, o) + x, ln1, fam.eps)
            x = w.layernorm(w.linear(act(w.linear(x, f1)), f2) + x, ln2, fam.eps)
    return x, mask == 0, w, fam


def run(folder, req):
    torch.set_num_threads(int(req.get("threads", 1)))
    rows = req["rows"]
    x, pad, w, fam = forward(folder, rows, req.get("type_ids"))
    with torch.no_grad():
        if req.get("head", "embedding") == "classifier":
            first = x[:, 0]
            if fam.kind == "distilbert":
                h = F.relu(w.linear(first, "pre_classifier"))
                logits = w.linear(h, "classifier")
            else:
                h = torch.tanh(w.linear(first, "classifier.dense"))
                logits = w.linear(h, "classifier.out_proj")
            # "scores": softmax, sigmoid (multi-label, or a cross-encoder's
            # Sigmoid), none (a cross-encoder's Identity); the older
            # boolean "sigmoid" picks between the first two
            scores = req.get("scores", "sigmoid" if req.get("sigmoid") else "softmax")
            if scores == "sigmoid":
                out = torch.sigmoid(logits)
            elif scores == "none":
                out = logits
            else:
                out = torch.softmax(logits, -1)
        else:
            pooling = req.get("pooling", "cls")
            keep = (~pad).unsqueeze(-1).to(x.dtype)
            if pooling == "cls":
                out = x[:, 0]
            elif pooling == "mean":
                out = (x * keep).sum(1) / keep.sum(1)
            elif pooling == "max":
                out = x.masked_fill(pad.unsqueeze(-1), float("-inf")).max(1).values
            else:
                out = torch.cat([x[i, :len(r)] for i, r in enumerate(rows)])
            if req.get("normalize"):
                out = F.normalize(out, p=2.0, dim=-1)
    return {"output": out.tolist()}


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        sys.exit("usage: torch_encoders.py FOLDER REQUEST [FOLDER REQUEST ...]")
    results = []
    for folder, path in zip(args[0::2], args[1::2]):
        with open(path) as f:
            results.append(run(folder, json.load(f)))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
