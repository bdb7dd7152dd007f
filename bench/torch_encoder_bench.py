#!/usr/bin/python3
"""torch_encoder_bench.py - PyTorch's side of the encoder row of make bench:
the same model folder, the same batches as `kinfer bench encode --dump`
wrote, in float32 with the same number of threads, timed the same way
(one untimed pass over every batch, then whole passes for at least
SECONDS).

Usage: torch_encoder_bench.py FOLDER BATCHES.jsonl THREADS SECONDS [DEVICE [DTYPE]]
       DEVICE cpu (default) or cuda; DTYPE float32 (default), float16, bfloat16

Prints one line, `torch: key=value ...`, as the kinfer bench commands do.
The model is tests/torch_encoder.py's: nn.Embedding, nn.LayerNorm and
nn.TransformerEncoderLayer (post-norm, gelu) with the folder's weights;
each batch runs padded with a key padding mask, then mean pooling and L2
normalization (the demo folder's head). In inference mode PyTorch's
encoder layer takes its fast path, which skips the padding (nested
tensors) as kinfer's packed batches do.
"""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from torch_encoder import Encoder  # noqa: E402


def main():
    folder, batches_path, threads, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(
        sys.argv[4])
    device = sys.argv[5] if len(sys.argv) > 5 else "cpu"
    dtype = getattr(torch, sys.argv[6] if len(sys.argv) > 6 else "float32")
    torch.set_num_threads(max(threads, 1))
    enc = Encoder(folder, dtype, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for layer in enc.layers:
        layer.eval()
    batches = [json.loads(line) for line in open(batches_path)]
    tokens = sum(len(r) for b in batches for r in b)
    seqs = sum(len(b) for b in batches)
    with torch.inference_mode():
        for b in batches:
            enc.run(b, pooling="mean", normalize=True)
        sync()
        t0 = time.perf_counter()
        passes = 0
        while True:
            for b in batches:
                enc.run(b, pooling="mean", normalize=True)
            sync()
            passes += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                break
    print("torch: version=%s device=%s dtype=%s threads=%d seqs=%d batches=%d passes=%d "
          "seqs_per_s=%.1f tokens_per_s=%.0f" % (torch.__version__, device, str(dtype)[6:],
                                                 torch.get_num_threads(), seqs, len(batches),
                                                 passes, seqs * passes / elapsed,
                                                 tokens * passes / elapsed))


if __name__ == "__main__":
    main()
