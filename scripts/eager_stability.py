#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The stability bound of sync::eager's outer lr on f(theta) = theta^2/2.

docs/algorithms.md section 4 derives the round's linear recurrence: with M
identical workers, inner phases that contract theta by c = (1 - gamma)^H
(k = 1 - c) and an SGD-like outer step (momentum mu; Nesterov, or heavy
ball with dampening tau), the replica's start points s_r satisfy

    z (z - 1)(z - mu) + a (z/M + 1 - 1/M)(n1 z + n0) = 0,   a = eta * k,

n1 = 1 + mu, n0 = -mu under Nesterov (n1 = 1 - tau, n0 = 0 for heavy ball).
The round is stable when every root is inside the unit circle. This script
finds the roots with numpy.roots (independently of the library's Jury test)
and bisects for the largest stable a; with k = 1 (each phase reaches the
optimum, the worst case of a contracting phase) that is the bound on eta.
It prints the bound, the library's default lr (0.8 x bound, capped at the
optimizer's default) and the spectral radius there.

    python3 scripts/eager_stability.py            # Nesterov 0.9, M = 1, 2, 4, 8
    python3 scripts/eager_stability.py --mu 0     # plain SGD
"""
import argparse

import numpy as np


def poly(M, a, mu, nesterov=True, tau=0.0):
    w = 1.0 / M
    n = np.array([1.0 + mu, -mu]) if nesterov else np.array([1.0 - tau, 0.0])
    p = np.array([1.0, -(1.0 + mu), mu, 0.0])
    p[1:] += a * np.polymul(np.array([w, 1.0 - w]), n)
    return p


def radius(M, a, mu, nesterov=True, tau=0.0):
    return max(abs(np.roots(poly(M, a, mu, nesterov, tau))))


def bound(M, mu, nesterov=True, tau=0.0, step=1.0 / 1024, top=64.0):
    lo, a = 0.0, step
    while a <= top:
        if radius(M, a, mu, nesterov, tau) < 1.0:
            lo, a = a, a + step
            continue
        hi = a
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if radius(M, mid, mu, nesterov, tau) < 1.0:
                lo = mid
            else:
                hi = mid
        return lo
    return float("inf")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mu", type=float, default=0.9, help="outer momentum (default 0.9)")
    ap.add_argument("--heavy-ball", action="store_true", help="heavy-ball momentum instead of Nesterov")
    ap.add_argument("--default-lr", type=float, default=0.7, help="the outer optimizer's default lr (0.7)")
    ap.add_argument("--safety", type=float, default=0.8, help="the library's safety factor (0.8)")
    ap.add_argument("workers", nargs="*", type=int, default=[1, 2, 4, 8])
    args = ap.parse_args()
    nest = not args.heavy_ball
    print("M  bound       default lr  radius at default  radius at 0.7")
    for M in args.workers:
        b = bound(M, args.mu, nest)
        lr = min(args.default_lr, args.safety * b)
        print(f"{M:<2} {b:.6f}    {lr:.6f}    {radius(M, lr, args.mu, nest):.4f}             "
              f"{radius(M, 0.7, args.mu, nest):.4f}")


if __name__ == "__main__":
    main()
