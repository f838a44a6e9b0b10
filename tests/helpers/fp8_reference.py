"""An independent FP8 reference for the tests: value tables decoded from the bit layout
(no torch casts), round-to-nearest-even by table search, block quantisation by loops.

Not imported by the library; only the tests use it. Slow by design, use small shapes.
"""

from __future__ import annotations

import math

import numpy as np

LAYOUT = {"e4m3": (4, 3, 7), "e5m2": (5, 2, 15)}  # exponent bits, mantissa bits, bias
MAX = {"e4m3": 448.0, "e5m2": 57344.0}


def decode(code: int, fmt: str) -> float:
    """Value of an 8-bit code from the OCP FP8 spec (E4M3FN: no inf, S.1111.111 is NaN)."""
    e_bits, m_bits, bias = LAYOUT[fmt]
    sign = -1.0 if code >> 7 else 1.0
    exp = (code >> m_bits) & ((1 << e_bits) - 1)
    man = code & ((1 << m_bits) - 1)
    if fmt == "e4m3" and exp == 0b1111 and man == 0b111:
        return math.nan
    if fmt == "e5m2" and exp == 0b11111:
        return sign * math.inf if man == 0 else math.nan
    if exp == 0:
        return sign * man * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + man / 2**m_bits) * 2.0 ** (exp - bias)


def finite_table(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """Sorted non-negative finite values and their codes."""
    vals, codes = [], []
    for code in range(128):
        v = decode(code, fmt)
        if math.isfinite(v):
            vals.append(v)
            codes.append(code)
    order = np.argsort(vals)
    return np.asarray(vals)[order], np.asarray(codes)[order]


def round_rne(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round to the nearest FP8 value, ties to the even code; saturate to ±max."""
    vals, codes = finite_table(fmt)
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        if math.isnan(v):
            out[i] = math.nan
            continue
        a = min(abs(v), MAX[fmt])
        j = int(np.searchsorted(vals, a))
        if j == 0:
            r = vals[0]
        elif j == len(vals):
            r = vals[-1]
        else:
            lo, hi = vals[j - 1], vals[j]
            if a - lo < hi - a:
                r = lo
            elif hi - a < a - lo:
                r = hi
            else:
                r = lo if codes[j - 1] % 2 == 0 else hi
        out[i] = math.copysign(r, v)
    return out


def fake_quant_ref(x: np.ndarray, fmt: str, br: int, bc: int, pow2: bool = False) -> np.ndarray:
    """Loop reference of block-scaled quantise→dequantise on a 2-D float32 array.

    Trailing partial blocks are just shorter groups. The multiplier follows TorchAO's rule
    (float64 division, stored as float32), the scaled value is a float32 product.
    """
    x = np.asarray(x, dtype=np.float32)
    out = np.empty_like(x)
    rows, cols = x.shape
    for r0 in range(0, rows, br):
        for c0 in range(0, cols, bc):
            g = x[r0 : r0 + br, c0 : c0 + bc]
            amax = float(np.abs(g).max())
            mult = np.float32(MAX[fmt] / max(amax, 1e-12))
            if pow2:
                mult = np.float32(2.0 ** math.floor(math.log2(mult)))
            q = round_rne((g * mult).astype(np.float32), fmt).astype(np.float32)
            out[r0 : r0 + br, c0 : c0 + bc] = q * (np.float32(1.0) / mult)  # times 1/mult
    return out
