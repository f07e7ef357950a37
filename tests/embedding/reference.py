"""NumPy references for the op library: the same math, written plainly."""

from __future__ import annotations

import numpy as np

M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def owner_of(key: int, parts: int) -> int:
    return mix64((key & M64) ^ 0x5851F42D4C957F2D) % parts


def initial_row(key: int, dim: int, seed: int = 0, scale: float = 0.05) -> np.ndarray:
    """The uniform initializer: a function of (seed, id) only."""
    base = mix64((key & M64) ^ mix64(seed & M64))
    out = np.empty(dim, np.float32)
    for j in range(dim):
        r = mix64((base + j * 0x9E3779B97F4A7C15) & M64)
        u = np.float32(r >> 40) * np.float32(1.0 / 16777216.0)
        out[j] = (np.float32(2.0) * u - np.float32(1.0)) * np.float32(scale)
    return out


class ReferenceTable:
    """A dict-of-rows table applying the Keras optimizer formulas."""

    def __init__(self, dim, optimizer="sgd", lr=0.1, eps=1e-7, init_acc=0.1, b1=0.9, b2=0.999):
        self.dim, self.optimizer, self.lr, self.eps = dim, optimizer, lr, eps
        self.init_acc, self.b1, self.b2 = init_acc, b1, b2
        self.rows: dict[int, np.ndarray] = {}
        self.slots: dict[int, list[np.ndarray]] = {}

    def lookup_or_insert(self, ids) -> np.ndarray:
        for k in ids:
            k = int(k)
            if k not in self.rows:
                self.rows[k] = initial_row(k, self.dim)
                n = {"sgd": 0, "adagrad": 1, "adam": 2}[self.optimizer]
                fill = self.init_acc if self.optimizer == "adagrad" else 0.0
                self.slots[k] = [np.full(self.dim, fill, np.float32) for _ in range(n)]
        return np.stack([self.rows[int(k)] for k in ids])

    def apply(self, ids, grads, step=1):
        folded: dict[int, np.ndarray] = {}
        for k, g in zip(ids, grads):
            folded[int(k)] = folded.get(int(k), 0) + np.asarray(g, np.float32)
        for k, g in folded.items():
            if k not in self.rows:
                continue
            w = self.rows[k]
            if self.optimizer == "sgd":
                w -= self.lr * g
            elif self.optimizer == "adagrad":
                acc = self.slots[k][0]
                acc += g * g
                w -= self.lr * g / (np.sqrt(acc) + self.eps)
            else:
                m, v = self.slots[k]
                m[:] = self.b1 * m + (1 - self.b1) * g
                v[:] = self.b2 * v + (1 - self.b2) * g * g
                alpha = self.lr * np.sqrt(1 - self.b2**step) / (1 - self.b1**step)
                w -= alpha * m / (np.sqrt(v) + self.eps)
