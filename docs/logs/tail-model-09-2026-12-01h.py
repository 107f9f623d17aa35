"""List-scheduling model of stage 9's forward under a random block mask (docs/notes.md,
2026-12-01 (h)). B*H heads of T query tiles; a block costs 1 step of fixed work plus 2 steps
(two 64-key tiles) per visible 128 x 128 mask tile, visible with probability `density`.
Blocks start in order on `slots` slots (two per SM), each on the slot that frees first.
No L2, no SM sharing. Prints, per density, the visible work over the makespan (dense = the
ceiling) for sections of S heads sorted heaviest first (S = 1: each head on its own).
Run: python3 docs/logs/tail-model-09-2026-12-01h.py"""
import heapq
import random


def efficiency(density, heads_per_section, fixed=1.0, B=2, H=16, T=64, slots=264, seed=1):
    rng = random.Random(seed)
    heads = [[fixed + 2 * sum(rng.random() < density for _ in range(T)) for _ in range(T)]
             for _ in range(B * H)]
    order = []
    for s in range(0, B * H, heads_per_section):
        order += sorted((w for h in heads[s:s + heads_per_section] for w in h), reverse=True)
    free = [0.0] * slots
    for w in order:
        heapq.heappush(free, heapq.heappop(free) + w)
    work = sum(order) - fixed * len(order)
    return work / slots / max(free)


if __name__ == "__main__":
    sizes = (1, 2, 4, 8, 32)
    print("density " + " ".join("S=%-4d" % s for s in sizes))
    for d in (1.0, 0.5, 0.25, 0.1):
        print("%-7s " % d + " ".join("%.3f " % (sum(efficiency(d, s, seed=k) for k in range(4)) / 4)
                                     for s in sizes))
