#!/usr/bin/python3
"""torch_encoder.py - the independent check of kinfer's BERT encoders:
runs a model folder through PyTorch's own modules (nn.Embedding,
nn.LayerNorm and nn.TransformerEncoderLayer, post-norm, gelu) with the
folder's weights, and prints what kinfer's encoder should produce.

Usage: torch_encoder.py FOLDER < request.json > result.json
   or: torch_encoder.py FOLDER REQUEST.json [FOLDER REQUEST.json ...] > results.json
       (a JSON array with one result per pair: one start of PyTorch, which
       takes longer than the checks themselves, serves a whole test)

request: {"rows": [[ids...], ...], "type_ids": [[...], ...] or null,
          "pooling": "cls"|"mean"|"max"|"none", "normalize": bool,
          "head": "embedding"|"classifier", "sigmoid": bool,
          "threads": N (optional)}
result:  {"output": [[floats...], ...]}: one row per sequence (pooled or
          classifier scores), or for pooling "none" one row per token, in
          the sequences' order.

The rows are run as one padded batch with a key padding mask, so the
check also covers masking. The weights are read from model.safetensors
by hand (the format is a JSON header and raw little-endian tensors);
python3-torch is Debian's, so no other package is needed. Float64
throughout: what is left is kinfer's own float32 rounding.
"""
import json
import sys

import torch
import torch.nn.functional as F
from torch import nn

from torch_st import read_safetensors  # tests/ is on sys.path



def tensor(ts, name):
    """name with or without "bert.", LayerNorm weight/bias also as gamma/beta."""
    cands = [name, "bert." + name]
    if "LayerNorm" in name:
        old = name.replace(".weight", ".gamma") if name.endswith(".weight") \
            else name.replace(".bias", ".beta")
        cands += [old, "bert." + old]
    for c in cands:
        if c in ts:
            return ts[c]
    raise KeyError(name)


class Encoder:
    """A folder's BERT encoder as PyTorch modules, in dtype."""

    def __init__(self, folder, dtype=torch.float64, device="cpu"):
        self.device = device
        cfg = json.load(open(folder + "/config.json"))
        ts = {k: v.to(dtype).to(device)
              for k, v in read_safetensors(folder + "/model.safetensors").items()}
        self.ts = ts
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        inter, eps = cfg["intermediate_size"], cfg.get("layer_norm_eps", 1e-12)
        act = cfg.get("hidden_act", "gelu")
        gelu = (lambda x: F.gelu(x, approximate="tanh")) if act != "gelu" else F.gelu
        with torch.no_grad():
            self.word = nn.Embedding.from_pretrained(tensor(ts, "embeddings.word_embeddings.weight"))
            self.posw = nn.Embedding.from_pretrained(
                tensor(ts, "embeddings.position_embeddings.weight"))
            self.typw = nn.Embedding.from_pretrained(
                tensor(ts, "embeddings.token_type_embeddings.weight"))
            self.ln = nn.LayerNorm(H, eps=eps).to(dtype).to(device)
            self.ln.weight.copy_(tensor(ts, "embeddings.LayerNorm.weight"))
            self.ln.bias.copy_(tensor(ts, "embeddings.LayerNorm.bias"))
            self.layers = []
            for i in range(cfg["num_hidden_layers"]):
                p = "encoder.layer.%d." % i
                layer = nn.TransformerEncoderLayer(H, nh, dim_feedforward=inter, dropout=0.0,
                                                   activation=gelu, layer_norm_eps=eps,
                                                   batch_first=True,
                                                   norm_first=False).to(dtype).to(device)
                layer.eval()
                q, k, v = ("attention.self.query", "attention.self.key", "attention.self.value")
                layer.self_attn.in_proj_weight.copy_(torch.cat(
                    [tensor(ts, p + q + ".weight"), tensor(ts, p + k + ".weight"),
                     tensor(ts, p + v + ".weight")]))
                layer.self_attn.in_proj_bias.copy_(torch.cat(
                    [tensor(ts, p + q + ".bias"), tensor(ts, p + k + ".bias"),
                     tensor(ts, p + v + ".bias")]))
                layer.self_attn.out_proj.weight.copy_(
                    tensor(ts, p + "attention.output.dense.weight"))
                layer.self_attn.out_proj.bias.copy_(tensor(ts, p + "attention.output.dense.bias"))
                layer.norm1.weight.copy_(tensor(ts, p + "attention.output.LayerNorm.weight"))
                layer.norm1.bias.copy_(tensor(ts, p + "attention.output.LayerNorm.bias"))
                layer.linear1.weight.copy_(tensor(ts, p + "intermediate.dense.weight"))
                layer.linear1.bias.copy_(tensor(ts, p + "intermediate.dense.bias"))
                layer.linear2.weight.copy_(tensor(ts, p + "output.dense.weight"))
                layer.linear2.bias.copy_(tensor(ts, p + "output.dense.bias"))
                layer.norm2.weight.copy_(tensor(ts, p + "output.LayerNorm.weight"))
                layer.norm2.bias.copy_(tensor(ts, p + "output.LayerNorm.bias"))
                self.layers.append(layer)

    def hidden(self, rows, types=None):
        """The last layer's states [n, L, H] of rows (lists of ids) run as one
        padded batch, and the padding mask [n, L] (True = padding)."""
        types = types or [[0] * len(r) for r in rows]
        n, L = len(rows), max(len(r) for r in rows)
        ids = torch.zeros(n, L, dtype=torch.long)
        tys = torch.zeros(n, L, dtype=torch.long)
        pad = torch.ones(n, L, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            tys[i, :len(r)] = torch.tensor(types[i])
            pad[i, :len(r)] = False
        ids, tys, pad = ids.to(self.device), tys.to(self.device), pad.to(self.device)
        with torch.no_grad():
            pos = torch.arange(L, device=self.device).unsqueeze(0).expand(n, L)
            x = self.ln(self.word(ids) + self.posw(pos) + self.typw(tys))
            for layer in self.layers:
                x = layer(x, src_key_padding_mask=pad)
        return x, pad

    def run(self, rows, types=None, pooling="cls", normalize=False, head="embedding",
            sigmoid=False):
        """What kinfer's encoder outputs for these rows (see the module doc)."""
        x, pad = self.hidden(rows, types)
        ts = self.ts
        with torch.no_grad():
            keep = (~pad).unsqueeze(-1).to(x.dtype)
            if head == "classifier":
                pooled = torch.tanh(F.linear(x[:, 0], tensor(ts, "pooler.dense.weight"),
                                             tensor(ts, "pooler.dense.bias")))
                logits = F.linear(pooled, ts["classifier.weight"], ts["classifier.bias"])
                return torch.sigmoid(logits) if sigmoid else torch.softmax(logits, -1)
            if pooling == "cls":
                out = x[:, 0]
            elif pooling == "mean":
                out = (x * keep).sum(1) / keep.sum(1)
            elif pooling == "max":
                out = x.masked_fill(pad.unsqueeze(-1), float("-inf")).max(1).values
            else:
                out = torch.cat([x[i, :len(r)] for i, r in enumerate(rows)])
            if normalize:
                out = F.normalize(out, p=2.0, dim=-1)
        return out


def run(folder, req):
    """The result for one request on one folder."""
    torch.set_num_threads(int(req.get("threads", 1)))
    enc = Encoder(folder)
    out = enc.run(req["rows"], req.get("type_ids"), req.get("pooling", "cls"),
                  bool(req.get("normalize")), req.get("head", "embedding"),
                  bool(req.get("sigmoid")))
    return {"output": out.tolist()}


def main():
    args = sys.argv[1:]
    if len(args) == 1:
        json.dump(run(args[0], json.load(sys.stdin)), sys.stdout)
        return
    if not args or len(args) % 2:
        sys.exit("usage: torch_encoder.py FOLDER < REQUEST, or FOLDER REQUEST [FOLDER REQUEST ...]")
    results = []
    for folder, path in zip(args[0::2], args[1::2]):
        with open(path) as f:
            results.append(run(folder, json.load(f)))
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
