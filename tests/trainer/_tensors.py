"""Small tensor helpers shared by the trainer tests."""

import math

import torch

LN = math.log


def t(x, **kw):
    return torch.tensor(x, dtype=torch.float32, **kw)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float32), t(expected), atol=tol, rtol=tol)
