"""Two-part balance for image-text steps: assign each step's samples to DP ranks and
micro-batches so that neither the encoder nor the backbone has a straggler, under a token
and a patch capacity per micro-batch.

A rank runs its images through the encoder, then its tokens through the backbone, so its
step time is E_r + B_r: the objective is the slowest rank's sum. Balancing the sum alone
can leave one part badly skewed (one rank all large images, another all long text), which
hurts as soon as the two parts do not run back to back (pipelined encoder, PP stages), so
the method balances the three loads together, each measured against its own lower bound:

    score(r) = max(E_r / LB_E, B_r / LB_B, S_r / LB_S)    (S = E + B)

with LB_X = max(total_X / D, largest sample's X). Method, per step (integer costs; every
comparison is of float64 ratios computed the same way on every machine, ties go to the
lower index, so the plan is byte-identical everywhere):
1. Greedy vector LPT: samples by their largest normalized part, descending, each to the
   rank whose score after taking it is lowest (ties: lowest sum, then lowest rank), among
   ranks with token and patch room (micro_batches x capacity).
2. Local search: while the highest-scoring rank has a move of one of its samples to
   another rank, or a swap with a sample of one of the SWAP_PARTNERS lowest-scoring
   ranks, that lowers the higher score of the pair (within room), apply the best such
   change (at most MAX_ROUNDS_PER_SAMPLE rounds per sample of the step).
3. Micro-batches: inside each rank, samples by cost, descending, each into the cheapest
   micro-batch with token and patch room. A rank that cannot be packed so (its samples fit
   its total room, not its micro-batches) sends the step to a bin-level greedy: each
   sample to the micro-batch with room whose rank's score after taking it is lowest.
A step whose samples fit no bin raises PlanError naming the step.
"""

from __future__ import annotations

import numpy as np

from mds.errors import PlanError
from mds.planner.plan.balance import Assignment, balance

__all__ = ["MAX_ROUNDS_PER_SAMPLE", "balance_parts", "part_bounds"]

MAX_ROUNDS_PER_SAMPLE = 4
SWAP_PARTNERS = 4  # swaps are tried with this many of the lowest-scoring ranks
SUM_SLACK_BITS = 7  # the parts' search may raise the top sum to its bound + 2^-7 (0.8%)
_IMPROVES = 1.0 - 2.0**-40  # a change must lower the pair's score by more than rounding


def part_bounds(values: np.ndarray, valid: np.ndarray, dp: int) -> np.ndarray:
    """Per step: max(ceil(total / D), largest sample), the lower bound of a rank's load."""
    v = np.where(valid, values, 0)
    return np.maximum(-(-v.sum(axis=1) // dp), v.max(axis=1, initial=0))


def _weights(lb: np.ndarray) -> np.ndarray:
    """1 / bound per part; 0 for a part the step has none of (it cannot straggle)."""
    lb = lb.astype(np.float64)
    return np.divide(1.0, lb, out=np.zeros_like(lb), where=lb > 0)


def balance_parts(
    enc: np.ndarray,
    bb: np.ndarray,
    length: np.ndarray,
    patches: np.ndarray,
    valid: np.ndarray,
    steps: np.ndarray,
    dp: int,
    micro: int,
    capacity: int,
    patch_capacity: int | None,
) -> Assignment:
    """Rank and micro-batch for every sample slot of T steps ([T, N] arrays; module doc).
    `load` is each rank's encoder + backbone cost."""
    T, N = enc.shape
    rank = np.full((T, N), -1, dtype=np.int64)
    mb = np.full((T, N), -1, dtype=np.int64)
    load = np.zeros((T, dp), dtype=np.int64)
    pcap = patch_capacity if patch_capacity is not None else np.iinfo(np.int64).max // (4 * micro)
    # The scalar balance of the sum (token capacity only): a start for steps where the
    # joint search leaves the sum high; one whose ranks break the patch room is not used.
    try:
        start = balance(enc + bb, length, valid, steps, dp, micro, capacity).rank
    except PlanError:  # some step cannot be packed: step 3's bin-level greedy says which
        start = None
    wE = _weights(part_bounds(enc, valid, dp))
    wB = _weights(part_bounds(bb, valid, dp))
    wS = _weights(part_bounds(enc + bb, valid, dp))
    for t in range(T):
        idx = np.flatnonzero(valid[t])
        if idx.size == 0:
            continue
        step = _Step(
            enc[t, idx], bb[t, idx], length[t, idx], patches[t, idx],
            np.array([wE[t], wB[t], wS[t]]), dp, micro, capacity, pcap, int(steps[t]),
        )
        r, m = step.solve(None if start is None else start[t, idx])
        rank[t, idx], mb[t, idx] = r, m
        load[t] = step.rank_sums(r)
    return Assignment(rank, mb, load)


class _Step:
    """One step's samples and geometry; `solve` gives (rank, micro-batch) per sample."""

    def __init__(self, e, b, tokens, patches, weights, dp, micro, capacity, pcap, step):
        self.parts = np.stack([e, b, e + b], axis=1).astype(np.int64)  # [n, 3]
        self.size = np.stack([tokens, patches], axis=1).astype(np.int64)  # [n, 2]
        self.w = weights
        self.dp, self.micro, self.step = dp, micro, step
        self.cap = np.array([capacity, pcap], dtype=np.int64)
        self.room = self.cap * micro
        total = self.parts[:, 2]
        self.lb_sum = int(max(-(-int(total.sum()) // dp), int(total.max(initial=0))))

    def rank_sums(self, rank: np.ndarray) -> np.ndarray:
        out = np.zeros(self.dp, dtype=np.int64)
        np.add.at(out, rank, self.parts[:, 2])
        return out

    def _score(self, loads: np.ndarray) -> np.ndarray:
        """max over parts of load x weight, along the last axis."""
        return (loads * self.w).max(axis=-1)

    def _fits(self, rank: np.ndarray) -> bool:
        used = np.zeros((self.dp, 2), dtype=np.int64)
        np.add.at(used, rank, self.size)
        return bool((used <= self.room).all())

    def _top_sum(self, rank: np.ndarray) -> int:
        return int(self.rank_sums(rank).max())

    def solve(self, start: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Steps 1 to 3; `start`: the ranks of the scalar balance of the sum (or None)."""
        rank = self._greedy()
        if rank is None:
            return self._bins()
        self._search(rank, self.w)
        parts = self.w * np.array([1.0, 1.0, 0.0])
        if start is not None and self._fits(start):
            # The sum is the objective: where the joint search left it above SUM_SLACK of
            # its bound and the scalar balance of the sum did better, start from that one.
            limit = max(self._top_sum(start), self.lb_sum + (self.lb_sum >> SUM_SLACK_BITS))
            if self._top_sum(rank) > limit:
                rank = start.copy()
        else:
            limit = max(self._top_sum(rank), self.lb_sum + (self.lb_sum >> SUM_SLACK_BITS))
        self._search(rank, parts, limit)
        micro = self._micro(rank)
        if micro is None:
            return self._bins()
        return rank, micro

    def _order(self) -> np.ndarray:
        size = (self.parts * self.w).max(axis=1)
        return np.lexsort((np.arange(len(size)), -size))

    def _greedy(self) -> np.ndarray | None:
        n = len(self.parts)
        loads = np.zeros((self.dp, 3), dtype=np.int64)
        used = np.zeros((self.dp, 2), dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)
        for i in self._order():
            fits = ((used + self.size[i]) <= self.room).all(axis=1)
            if not fits.any():
                return None
            after = loads + self.parts[i]
            score = np.where(fits, self._score(after), np.inf)
            best = np.flatnonzero(score == score.min())
            r = int(best[np.argmin(after[best, 2])]) if len(best) > 1 else int(best[0])
            rank[i] = r
            loads[r] += self.parts[i]
            used[r] += self.size[i]
        return rank

    def _search(self, rank: np.ndarray, w: np.ndarray, limit: float = np.inf) -> None:
        """Step 2, in place on `rank`: lower the top score of weights `w` by moves and swaps,
        keeping every rank's sum at or below `limit`."""
        n = len(rank)
        loads = np.zeros((self.dp, 3), dtype=np.int64)
        used = np.zeros((self.dp, 2), dtype=np.int64)
        np.add.at(loads, rank, self.parts)
        np.add.at(used, rank, self.size)

        def score(x):
            return (x * w).max(axis=-1)

        for _ in range(MAX_ROUNDS_PER_SAMPLE * n):
            scores = score(loads)
            w_ = int(np.argmax(scores))
            top = scores[w_]
            mine = np.flatnonzero(rank == w_)
            best, change = top * _IMPROVES, None
            # moves: sample i of w_ to rank r
            lw = loads[w_] - self.parts[mine]  # [k, 3]
            uw = used[w_] - self.size[mine]
            lr = loads[None, :, :] + self.parts[mine][:, None, :]  # [k, D, 3]
            ur = used[None, :, :] + self.size[mine][:, None, :]
            pair = np.maximum(score(lw)[:, None], score(lr))
            ok = (ur <= self.room).all(axis=2) & (uw <= self.room).all(axis=1)[:, None]
            ok &= lr[:, :, 2] <= limit
            ok[:, w_] = False
            pair = np.where(ok, pair, np.inf)
            k, r = np.unravel_index(int(np.argmin(pair)), pair.shape)
            if pair[k, r] < best:
                best, change = pair[k, r], ("move", int(mine[k]), int(r))
            # swaps: sample i of w_ with a sample of one of the lowest-scoring ranks
            partners = np.argsort(scores, kind="stable")[:SWAP_PARTNERS]
            other = np.flatnonzero(np.isin(rank, partners[partners != w_]))
            if other.size:
                delta = self.parts[other][None, :, :] - self.parts[mine][:, None, :]  # [k, m, 3]
                dsize = self.size[other][None, :, :] - self.size[mine][:, None, :]
                rj = rank[other]
                after_w = loads[w_] + delta
                after_r = loads[rj][None, :, :] - delta
                okw = ((used[w_] + dsize) <= self.room).all(axis=2) & (after_w[:, :, 2] <= limit)
                okr = ((used[rj][None, :, :] - dsize) <= self.room).all(axis=2)
                okr &= after_r[:, :, 2] <= limit
                pair = np.where(okw & okr, np.maximum(score(after_w), score(after_r)), np.inf)
                k, j = np.unravel_index(int(np.argmin(pair)), pair.shape)
                if pair[k, j] < best:
                    best, change = pair[k, j], ("swap", int(mine[k]), int(other[j]))
            if change is None:
                return
            kind, i, x = change
            if kind == "move":
                loads[w_] -= self.parts[i]
                used[w_] -= self.size[i]
                loads[x] += self.parts[i]
                used[x] += self.size[i]
                rank[i] = x
            else:
                r = int(rank[x])
                d, ds = self.parts[x] - self.parts[i], self.size[x] - self.size[i]
                loads[w_] += d
                used[w_] += ds
                loads[r] -= d
                used[r] -= ds
                rank[i], rank[x] = r, w_
        assert (used <= self.room).all()

    def _micro(self, rank: np.ndarray) -> np.ndarray | None:
        """Step 3: micro-batches inside each rank; None if some rank cannot be packed."""
        micro = np.empty(len(rank), dtype=np.int64)
        cost = self.parts[:, 2]
        order = np.lexsort((np.arange(len(cost)), -cost))
        mcost = np.zeros((self.dp, self.micro), dtype=np.int64)
        mused = np.zeros((self.dp, self.micro, 2), dtype=np.int64)
        for i in order:
            r = rank[i]
            fits = ((mused[r] + self.size[i]) <= self.cap).all(axis=1)
            if not fits.any():
                return None
            m = int(np.argmin(np.where(fits, mcost[r], np.iinfo(np.int64).max)))
            micro[i] = m
            mcost[r, m] += cost[i]
            mused[r, m] += self.size[i]
        return micro

    def _bins(self) -> tuple[np.ndarray, np.ndarray]:
        """The bin-level greedy of step 3: each sample, largest first, into the micro-batch
        with room whose rank scores lowest after taking it."""
        n = len(self.parts)
        loads = np.zeros((self.dp, 3), dtype=np.int64)
        used = np.zeros((self.dp, self.micro, 2), dtype=np.int64)
        mcost = np.zeros((self.dp, self.micro), dtype=np.int64)
        rank = np.empty(n, dtype=np.int64)
        micro = np.empty(n, dtype=np.int64)
        for i in self._order():
            fits = ((used + self.size[i]) <= self.cap).all(axis=2)  # [D, M]
            if not fits.any():
                tokens, patches = self.size[i]
                raise PlanError(
                    f"step {self.step}: a sample of {tokens} tokens and {patches} patches fits "
                    f"no micro-batch of {self.dp} ranks x {self.micro} (capacity "
                    f"{self.cap[0]} tokens, {self.cap[1]} patches); raise the capacities or "
                    "plan fewer samples per step"
                )
            score = np.where(fits.any(axis=1), self._score(loads + self.parts[i]), np.inf)
            r = int(np.argmin(score))
            m = int(np.argmin(np.where(fits[r], mcost[r], np.iinfo(np.int64).max)))
            rank[i], micro[i] = r, m
            loads[r] += self.parts[i]
            used[r, m] += self.size[i]
            mcost[r, m] += self.parts[i, 2]
        return rank, micro
