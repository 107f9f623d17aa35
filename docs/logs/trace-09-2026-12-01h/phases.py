"""Per-block phases of stage 9's forward from the traces in this folder (docs/notes.md, 2026-12-01 (h)).
Each CSV: one row per block of the last --bench call, B = 2, H = 16, N = 8192, d = 128: the SM, and %globaltimer (ns) at
entry, when step 0 starts computing (Q_i and the first K_j, V_j landed), after the loop and at the end. Built from
stage 9 at 531831b with probe.diff applied. Run: python3 docs/logs/trace-09-2026-12-01h/phases.py docs/logs/trace-09-2026-12-01h/*.csv"""
import csv, sys, statistics as st
def an(path):
    rows=[r for r in csv.DictReader(open(path))]
    for r in rows:
        for k in ('sm','start','first_step','loop_end','end'): r[k]=int(r[k])
    t0=min(r['start'] for r in rows); t1=max(r['end'] for r in rows)
    span=t1-t0
    bysm={}
    for r in rows: bysm.setdefault(r['sm'],[]).append(r)
    # per SM: busy union of block intervals; blocks resident
    idle_end=[]; busy=[]
    for sm,rs in bysm.items():
        last=max(r['end'] for r in rs); idle_end.append(t1-last)
    ok=[r for r in rows if r['start']<=r['first_step']<=r['loop_end']<=r['end']]
    pro=[r['first_step']-r['start'] for r in ok]; loop=[r['loop_end']-r['first_step'] for r in ok]; epi=[r['end']-r['loop_end'] for r in ok]
    tot=[r['end']-r['start'] for r in rows]
    # block-slot occupancy: sum of block durations / (2 slots * nSM * span)
    occ=sum(tot)/(2*len(bysm)*span)
    print(f"{path}: blocks {len(rows)} SMs {len(bysm)} span {span/1e3:.1f} us; slot occupancy {occ:.3f}")
    print(f"  per block us: prologue med {st.median(pro)/1e3:.2f} mean {st.mean(pro)/1e3:.2f}; loop mean {st.mean(loop)/1e3:.2f}; epilogue med {st.median(epi)/1e3:.2f} mean {st.mean(epi)/1e3:.2f}; total mean {st.mean(tot)/1e3:.2f}")
    print(f"  fixed (prologue+epilogue) share of block time: {(st.mean(pro)+st.mean(epi))/st.mean(tot):.3f}")
    ie=sorted(idle_end)
    print(f"  SM idle at the end us: median {st.median(ie)/1e3:.1f}, mean {st.mean(ie)/1e3:.1f}, max {ie[-1]/1e3:.1f}; share of span (mean) {st.mean(ie)/span:.3f}")
    # start gaps: time from a block end to the next block start on the same SM (launch latency)
    gaps=[]
    for sm,rs in bysm.items():
        rs=sorted(rs,key=lambda r:r['start'])
        ends=[]
        for r in rs:
            # a new block starts when a slot frees: gap = start - latest end before start
            prev=[e for e in ends if e<=r['start']]
            if len(ends)>=2 and prev: gaps.append(r['start']-max(prev))
            ends.append(r['end'])
    if gaps: print(f"  slot refill gap us: median {st.median(gaps)/1e3:.2f} mean {st.mean(gaps)/1e3:.2f}")
    # first wave start spread
    starts=sorted(r['start']-t0 for r in rows)
    print(f"  first 264 starts within {starts[263]/1e3:.1f} us")
for p in sys.argv[1:]: an(p)
