"""Generate the exact real-Wishart moment table used by iclab.theory.wishart.

E tr((G Gᵀ)^k) for G ∈ R^{d×n} with iid N(0, 1) entries is, by Wick's theorem, a sum over the
(2k−1)!! pairings of the 2k entries G_{i_t j_t}, G_{i_{t+1} j_t} (t = 1..k, i_{k+1} = i_1) of
d^{#row classes} n^{#column classes}. This script counts pairings by (row classes, column classes)
for k ≤ KMAX and prints the table as Python source. Run: python scripts/wishart_pairings.py 8
"""

from __future__ import annotations

import sys
from collections import Counter


def table(k: int) -> Counter[tuple[int, int]]:
    rows = [t for t in range(k) for t in (t, (t + 1) % k)]  # row index variable of entry e
    cols = [t for t in range(k) for _ in (0, 1)]  # column index variable of entry e
    counts: Counter[tuple[int, int]] = Counter()

    def find(p: list[int], a: int) -> int:
        while p[a] != a:
            a = p[a]
        return a

    def rec(free: list[int], pr: list[int], pc: list[int]) -> None:
        if not free:
            counts[(sum(find(pr, a) == a for a in range(k)), sum(find(pc, a) == a for a in range(k)))] += 1
            return
        e, rest = free[0], free[1:]
        for idx, f in enumerate(rest):
            qr, qc = pr[:], pc[:]
            a, b = find(qr, rows[e]), find(qr, rows[f])
            if a != b:
                qr[a] = b
            a, b = find(qc, cols[e]), find(qc, cols[f])
            if a != b:
                qc[a] = b
            rec(rest[:idx] + rest[idx + 1 :], qr, qc)

    rec(list(range(2 * k)), list(range(k)), list(range(k)))
    return counts


if __name__ == "__main__":
    kmax = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print("WISHART_PAIRINGS = {")
    for k in range(1, kmax + 1):
        c = table(k)
        print(f"    {k}: {dict(sorted(c.items()))},")
    print("}")
