# Prints the issue-46 table from the raw outputs here: avx2_N.txt
# (DILOCO_HOST_SIMD=avx2) and avx512_N.txt, least and largest of the runs.
import re, sys
def load(f):
    d = {}
    for line in open(f):
        m = re.match(r'^(\S+): (\S+)$', line.strip())
        if m:
            try: d[m.group(1)] = float(m.group(2))
            except ValueError: pass
    return d
A = [load(f'avx2_{i}.txt') for i in (1, 2, 3)]
B = [load(f'avx512_{i}.txt') for i in (1, 2, 3)]
def rng(L, k):
    v = [d[k] for d in L if k in d]
    a, b = min(v), max(v)
    return f'{a:.2f}' if f'{a:.2f}' == f'{b:.2f}' else f'{a:.2f}–{b:.2f}'
print('triad GB/s: avx2 runs', [round(d['int8.triad_gbps'], 1) for d in A], 'avx512 runs', [round(d['int8.triad_gbps'], 1) for d in B])
print('| codec | encode AVX2 → AVX-512 | reduce AVX2 → AVX-512 | decode-apply (overwrite / rebase / eager) | check (one thread) | validate | checksum |')
print('|---|---|---|---|---|---|---|')
for c in ['bf16', 'int8', 'int4', 'fp8_e4m3', 'fp8_e5m2', 'fp4_e3m0', 'int2']:
    for ef in ('', '_ef'):
        k = c + ef
        name = c.replace('_', '\\_') + (' +EF' if ef else '')
        print(f"| {name} | {rng(A, k + '.encode_vs_triad')} → {rng(B, k + '.encode_vs_triad')} | "
              f"{rng(A, k + '.reduce_vs_triad')} → {rng(B, k + '.reduce_vs_triad')} | "
              f"{rng(B, k + '.decode_apply_vs_triad')} / {rng(B, k + '.decode_apply_rebase_vs_triad')} / {rng(B, k + '.decode_apply_eager_vs_triad')} | "
              f"{rng(B, k + '.check_vs_triad')} | {rng(B, k + '.validate_vs_triad')} | {rng(B, k + '.checksum_vs_triad')} |")
for k in sorted(B[0]):
    if k.startswith('chunk') and k.endswith('vs_triad'):
        print(k, rng(A, k), '→', rng(B, k))
