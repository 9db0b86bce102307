"""MEASUREMENT PROTOTYPE (issue 34 item 2): pools the rounds of several compare.py outputs: per server and route the
median, quartiles and range of req/s and p99, the same for runs with p99 < 1 ms (the ones no other process on the
shared machine got in the way of), and Beast's req/s over ours paired by round.

    python bench/experiments/http_beast/pool_runs.py series1.txt series2.txt ...
"""
import re, sys, statistics as st
rows = []
for f in sys.argv[1:]:
    for line in open(f):
        m = re.match(r"round (\d+) (\w+)\s+(\S+)\s+(\d+) req/s\s+p50 ([\d.]+) ms\s+p99 ([\d.]+) ms", line)
        if m:
            r, name, what, rate, p50, p99 = m.groups()
            rows.append((f, int(r), name, what, float(rate), float(p99)))
def q(xs, p):
    xs = sorted(xs); return xs[min(len(xs)-1, int(p*len(xs)))]
for what in ("ceiling", "lookup+update"):
    d = {}
    for f, r, name, w, rate, p99 in rows:
        if w == what: d.setdefault(name, {})[(f, r)] = (rate, p99)
    for name in ("ours", "beast"):
        rates = [v[0] for v in d[name].values()]; p99 = [v[1] for v in d[name].values()]
        quiet = [v for v in d[name].values() if v[1] < 1.0]
        print(f"{what:<14} {name:<5} n={len(rates)} req/s median {st.median(rates):7.0f} IQR {q(rates,.25):.0f}-{q(rates,.75):.0f} range {min(rates):.0f}-{max(rates):.0f} | p99 median {st.median(p99):.2f} IQR {q(p99,.25):.2f}-{q(p99,.75):.2f} | runs with p99<1ms: {len(quiet)}, their req/s median {st.median([v[0] for v in quiet]):.0f}, p99 median {st.median([v[1] for v in quiet]):.2f}")
    keys = d["ours"].keys()
    ratio = [d["beast"][k][0] / d["ours"][k][0] for k in keys]
    both_quiet = [d["beast"][k][0] / d["ours"][k][0] for k in keys if d["beast"][k][1] < 1 and d["ours"][k][1] < 1]
    print(f"{what:<14} beast/ours paired over {len(ratio)} rounds: median {st.median(ratio):.3f} IQR {q(ratio,.25):.2f}-{q(ratio,.75):.2f}, beast ahead in {sum(x>1 for x in ratio)}; rounds where both had p99<1ms: {len(both_quiet)}, median ratio {st.median(both_quiet):.3f} ({min(both_quiet):.2f}-{max(both_quiet):.2f})")
