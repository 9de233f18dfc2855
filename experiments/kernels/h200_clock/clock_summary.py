"""Per recorded case of a clock_call.sh call: the SM clock, the power and how often the software
power cap was in force over the samples with the GPU more than 50% busy.

    python3 experiments/kernels/h200_clock/clock_summary.py DIR   (DIR: smi_runtime.csv, clock_runtime.log)
"""

import csv
import datetime as dt
import re
import statistics
import sys

d = sys.argv[1]
rows = list(csv.reader(open(f"{d}/smi_runtime.csv")))[1:]


def ts(s):
    return dt.datetime.strptime(s.strip(), "%Y/%m/%d %H:%M:%S.%f")


samples = []
for r in rows:
    if len(r) < 5 or "MHz" not in r[1]:
        continue
    samples.append(
        (
            ts(r[0]),
            int(r[1].split()[0]),
            float(r[2].split()[0]),
            r[3].strip(),
            int(r[4].strip().rstrip(" %") or 0),
        )
    )
log = open(f"{d}/clock_runtime.log").read()
marks = re.findall(r"== (\d\d:\d\d:\d\d\.\d+) (start|end) (\S+)", log)
day = samples[0][0].date()
spans = {}
last = None
for t, kind, case in marks:
    at = dt.datetime.combine(day, dt.datetime.strptime(t[:15], "%H:%M:%S.%f").time())
    if last is not None and at < last:  # the call ran past midnight
        day += dt.timedelta(days=1)
        at += dt.timedelta(days=1)
    last = at
    spans.setdefault(case, {})[kind] = at
for case, se in spans.items():
    ss = [s for s in samples if se["start"] <= s[0] <= se.get("end", s[0]) and s[4] > 50]
    if not ss:
        print(f"{case}: no busy samples")
        continue
    capped = [s for s in ss if s[3] == "0x0000000000000004"]
    clk = [s[1] for s in ss]
    print(
        f"{case}: busy samples {len(ss)}, SM clock median {statistics.median(clk):.0f} min {min(clk)}, under the power cap {len(capped)} ({len(capped) / len(ss):.0%}), capped median {statistics.median([s[1] for s in capped]) if capped else '-'} MHz, power median {statistics.median([s[2] for s in ss]):.0f} W"
    )
