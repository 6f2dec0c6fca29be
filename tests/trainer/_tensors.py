"""Small tensor helpers shared by the trainer tests."""

import math

import torch

LN = math.log


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float32, **kw)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), t(expected), atol=tol, rtol=tol)


def same_state(a, b):
    """Two nested state dicts hold the same structure and bit-identical tensors."""
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            same_state(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same_state(x, y)
    else:
        assert a == b
