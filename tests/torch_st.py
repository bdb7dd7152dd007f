"""torch_st.py - reading a safetensors file into float64 torch tensors, for
the PyTorch references of the tests (tests/torch_*.py) and the benchmark
(bench/torch_*.py): the 8-byte header length, the JSON header, then each
tensor's bytes (F32, F16 or BF16) at its data_offsets. Debian's
python3-torch has no safetensors package, so the format is read here."""
import json
import struct

import torch

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def read_safetensors(path, out=None, dtype=torch.float64):
    """The tensors of the file at path, by name, converted to dtype, added
    to out (a new dict when None), which is returned."""
    out = {} if out is None else out
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen])
    base = 8 + hlen
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = bytearray(blob[base + a:base + b])
        ten = torch.frombuffer(raw, dtype=DTYPES[t["dtype"]]) if raw else torch.zeros(0)
        out[name] = ten.reshape(t["shape"]).to(dtype)
    return out
