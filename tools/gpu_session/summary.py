"""What each record and step log under a gpu-check --out folder says, in one screen (run.sh)."""
import json
import statistics
import sys
from pathlib import Path

from workloads.core.records import iter_records

root = Path(sys.argv[1])
for p, r in iter_records(root, "*/records/*.json"):
    m, s = r.get("metrics") or {}, r.get("samples") or {}
    t = (r.get("fabric") or {}).get("transport") or {}
    print(f"== {p.relative_to(root)}  workload={r.get('workload')} status={r.get('status')} error={r.get('error')}")
    print(f"   world={r.get('world')} batch={r.get('batch')} gpu={(r.get('fingerprint') or {}).get('gpu')}")
    print(f"   transport: {t.get('verdict')} {t.get('message') or ''} summary={json.dumps(t.get('summary'))[:160]}")
    keep = {k: v for k, v in m.items() if not isinstance(v, (list, dict))}
    print(f"   metrics: {json.dumps(keep)[:1500]}")
    if s.get("step_time_s"):
        st = s["step_time_s"][int(s.get("warmup_steps") or 0):]
        print(f"   timed steps: n={len(st)} mean={statistics.fmean(st):.5f}s min={min(st):.5f} max={max(st):.5f}")
        if r.get("model") and r.get("batch"):
            from workloads.training.expected import mfu_check, tflops_check
            print(f"   tflops_check: {tflops_check(r)[:3]}\n   mfu_check: {mfu_check(r)[:3]}")
    for row in (r.get("rows") or [])[:12]:
        print(f"   row: {json.dumps(row)[:300]}")
    if r.get("comm"):
        print(f"   comm: {json.dumps(r['comm'])[:400]}")
for log in sorted(root.glob("*.log")):
    text = log.read_text(errors="replace").splitlines()
    print(f"== {log.name}: {len(text)} lines; last 6:")
    for line in text[-6:]:
        print("   " + line[:300])
