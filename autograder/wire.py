"""The judge's wire format: one message = a JSON header and raw tensor bytes, over a Unix socket.

Both sides use it: the kernel (autograder/judge_client.py, student code runs there) and the judge
(autograder/judge.py, where no student code runs). Nothing is ever unpickled: a message is a
4-byte length, a JSON header, and the bytes of each tensor the header lists (dtype, shape, size),
so a hostile sender can make the judge read wrong numbers but never run code.

Values a check's call returned are encoded as a tree: a tensor ``{"t": i}`` (the i-th blob), a
tuple or list ``{"seq": [...], "kind": "tuple"}``, a plain value ``{"v": x}``, anything else
``{"opaque": "TypeName"}`` (the check then says "got TypeName").
"""
from __future__ import annotations

import json
import numbers
import socket
import struct

import torch

MAX_HEADER = 1 << 20           # bytes of JSON in one message
MAX_BLOBS = 1 << 34            # bytes of tensors in one message (16 GiB: full-size GPU outputs fit)
_LEN = struct.Struct("!IQ")    # header length, blob length

DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
    torch.int64, torch.uint8, torch.bool)}


class WireError(RuntimeError):
    """A malformed message: the sender broke the protocol."""


# ----------------------------------------------------------------------------- values
def encode(value, blobs: list[bytes]):
    """``value`` as a JSON-able tree; tensor bytes are appended to ``blobs``."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.dtype not in DTYPES.values():
            return {"opaque": f"Tensor of dtype {t.dtype}"}
        device = t.device.type
        t = t.to("cpu").contiguous()
        blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        return {"t": len(blobs) - 1, "dtype": str(t.dtype).removeprefix("torch."),
                "shape": list(t.shape), "device": device}
    if isinstance(value, (tuple, list)):
        return {"seq": [encode(x, blobs) for x in value], "kind": type(value).__name__
                if type(value) in (tuple, list) else "tuple"}
    if isinstance(value, numbers.Number) and not isinstance(value, (bool, int, float)):
        # NumPy's scalars (np.int64, np.float32) travel as the plain numbers they stand for
        if isinstance(value, numbers.Integral):
            return {"v": int(value)}
        if isinstance(value, numbers.Real):
            return encode(float(value), blobs)
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, float) and value != value:
            return {"v": "nan", "float": True}
        return {"v": value}
    return {"opaque": type(value).__name__}


def _opaque(name: str):
    return type(name if name.isidentifier() else "Unknown", (), {"__repr__": lambda self: f"<{name}>"})()


def decode(tree, blobs: list[bytes], device: str | torch.device = "cpu"):
    """Rebuild a value from ``encode``'s tree; tensors recorded on a GPU go to ``device``."""
    if not isinstance(tree, dict):
        raise WireError("a value must be a JSON object")
    if "t" in tree:
        dtype = DTYPES.get(tree.get("dtype"))
        shape = tree.get("shape")
        i = tree["t"]
        if dtype is None or not isinstance(shape, list) or not isinstance(i, int) or not 0 <= i < len(blobs):
            raise WireError("bad tensor header")
        raw = blobs[i]
        n = 1
        for s in shape:
            if not isinstance(s, int) or s < 0:
                raise WireError("bad tensor shape")
            n *= s
        size = torch.empty((), dtype=dtype).element_size()
        if len(raw) != n * size:
            raise WireError(f"tensor bytes {len(raw)} do not match shape {shape} of {dtype}")
        t = (torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).reshape(shape)
             if n else torch.empty(shape, dtype=dtype))
        return t.to(device) if tree.get("device") == "cuda" else t
    if "seq" in tree:
        items = [decode(x, blobs, device) for x in tree["seq"]]
        return items if tree.get("kind") == "list" else tuple(items)
    if "v" in tree:
        return float("nan") if tree.get("float") else tree["v"]
    return _opaque(str(tree.get("opaque", "object")))


# ----------------------------------------------------------------------------- messages
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 1 << 24))
        if k == 0:
            raise EOFError("connection closed")
        got += k
    return bytes(buf)


def send(sock: socket.socket, header: dict, blobs: list[bytes] = ()) -> None:
    head = json.dumps({**header, "blob_sizes": [len(b) for b in blobs]}).encode()
    sock.sendall(_LEN.pack(len(head), sum(len(b) for b in blobs)) + head)
    for b in blobs:
        sock.sendall(b)


def recv(sock: socket.socket, max_blobs: int = MAX_BLOBS) -> tuple[dict, list[bytes]]:
    """One message; a message whose tensors exceed ``max_blobs`` bytes is refused before it is read."""
    n_head, n_blobs = _LEN.unpack(_recv_exact(sock, _LEN.size))
    if n_head > MAX_HEADER or n_blobs > min(max_blobs, MAX_BLOBS):
        raise WireError(f"message too large ({n_head} + {n_blobs} bytes)")
    try:
        header = json.loads(_recv_exact(sock, n_head))
    except ValueError as err:
        raise WireError(f"header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise WireError("header must be a JSON object")
    sizes = header.pop("blob_sizes", [])
    if not isinstance(sizes, list) or sum(sizes) != n_blobs or any(not isinstance(s, int) or s < 0 for s in sizes):
        raise WireError("blob sizes do not add up")
    data = _recv_exact(sock, n_blobs)
    blobs, at = [], 0
    for s in sizes:
        blobs.append(data[at:at + s])
        at += s
    return header, blobs
