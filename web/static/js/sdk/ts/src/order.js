/** Messages held per conversation while a hole is fetched. */
const maxPending = 4096;
/**
 * ConvOrder turns one conversation's pushes, snapshot entries and history
 * pages into a stream in strictly increasing seq without duplicates or holes
 * (a port of the Go SDK's convOrder; pure bookkeeping, the client does the
 * fetches it asks for).
 */
export class ConvOrder {
    last;
    known;
    pending = new Map();
    fetching = false;
    fetchCover = 0;
    /** known is false until the starting point is established. */
    constructor(last, known) {
        this.last = last;
        this.known = known;
    }
    /** Takes one message; returns the messages now ready, in order. */
    offer(m) {
        if (this.known && m.seq <= this.last)
            return [];
        if (this.known && m.seq === this.last + 1) {
            this.last = m.seq;
            return this.drain([m]);
        }
        if (this.pending.has(m.seq) || this.pending.size >= maxPending)
            return [];
        this.pending.set(m.seq, m);
        return [];
    }
    hole() { return this.pending.size > 0; }
    needFetch() { return this.known && this.hole() && !this.fetching; }
    /** Marks a fetch in flight; returns its after_seq. */
    startFetch() {
        this.fetching = true;
        this.fetchCover = this.maxPendingSeq();
        return this.last;
    }
    fetchFailed() { this.fetching = false; }
    /**
     * Applies one ascending history page fetched with after_seq: the ready
     * messages, whether another page is needed, and how many seqs were jumped
     * because the server cannot show them to this member.
     */
    fill(msgs, hasMore) {
        this.fetching = false;
        const before = this.last;
        const ready = [];
        for (const m of msgs)
            ready.push(...this.offer(m));
        if (hasMore)
            return { ready, again: true, skipped: 0 };
        if (!this.hole())
            return { ready, again: false, skipped: 0 };
        const low = this.minPendingSeq();
        if (this.last === before && low <= this.fetchCover) {
            const j = this.jumpTo(low - 1);
            ready.push(...j.ready);
            return { ready, again: this.hole(), skipped: j.skipped };
        }
        return { ready, again: true, skipped: 0 };
    }
    /** Moves the starting point forward to base; never backwards. */
    jumpTo(base) {
        let skipped = 0;
        if (!this.known) {
            this.known = true;
            this.last = base;
        }
        else {
            if (base <= this.last)
                return { ready: [], skipped: 0 };
            skipped = base - this.last;
            this.last = base;
        }
        for (const s of [...this.pending.keys()])
            if (s <= this.last)
                this.pending.delete(s);
        return { ready: this.drain([]), skipped };
    }
    /** Gives up on every hole and hands over everything held. */
    releaseAll() {
        const ready = [];
        while (this.hole())
            ready.push(...this.jumpTo(this.minPendingSeq() - 1).ready);
        return ready;
    }
    drain(ready) {
        for (;;) {
            const m = this.pending.get(this.last + 1);
            if (!m)
                return ready;
            this.pending.delete(m.seq);
            this.last = m.seq;
            ready.push(m);
        }
    }
    minPendingSeq() {
        let low = 0;
        for (const s of this.pending.keys())
            if (low === 0 || s < low)
                low = s;
        return low;
    }
    maxPendingSeq() {
        let high = 0;
        for (const s of this.pending.keys())
            if (s > high)
                high = s;
        return high;
    }
}
