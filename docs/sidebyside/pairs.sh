#!/bin/sh
# pairs.sh N OLD NEW: N interleaved runs of BenchmarkRecoverSideBySide,
# upstream and two poolalloc test binaries (built by setup.sh from two
# commits), then medians and per-run ratios. Run it from OpenSandbox's
# kubernetes/internal/controller. BT sets -test.benchtime (40x).
set -eu
n=$1 old=$2 new=$3 bt=${BT:-40x}
out=$(mktemp)
run() { "$1" -test.run '^$' -test.bench "$2" -test.benchtime "$bt" 2>&1 | awk '/^Benchmark/{print $3}'; }
for i in $(seq "$n"); do
	echo "upstream-Recover $(run "$new" 'BenchmarkRecoverSideBySide/upstream$')"
	echo "upstream-first-Schedule $(run "$new" 'BenchmarkRecoverSideBySide/upstream-first-schedule$')"
	echo "old-marks $(run "$old" 'BenchmarkRecoverSideBySide/poolalloc/marks=true$')"
	echo "new-marks $(run "$new" 'BenchmarkRecoverSideBySide/poolalloc/marks=true$')"
	echo "old-nomarks $(run "$old" 'BenchmarkRecoverSideBySide/poolalloc/marks=false$')"
	echo "new-nomarks $(run "$new" 'BenchmarkRecoverSideBySide/poolalloc/marks=false$')"
done >"$out"
python3 - "$out" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    k, v = line.split()
    d[k].append(int(v) / 1e6)
for k, v in d.items():
    print(f"{k:24} median {statistics.median(v):6.2f} ms  runs {' '.join(f'{x:.1f}' for x in v)}")
for k in ("old-marks", "new-marks", "old-nomarks", "new-nomarks"):
    for up in ("upstream-Recover", "upstream-first-Schedule"):
        r = sorted(a / b for a, b in zip(d[up], d[k]))
        print(f"{k:12} vs {up:24} median of per-run ratios {statistics.median(r):.2f}x  ({' '.join(f'{x:.2f}' for x in r)})")
PY
rm -f "$out"
