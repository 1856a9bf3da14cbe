package traffic

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/converger/edge/sidecar/limiter"
)

// hotKeys is one bucket's table of busy candidates: at most Candidates keys with the
// count they were last offered with. A key is offered when its count reaches a power of
// two or first goes over its limit, so a key is offered at most about 33 times a
// window; once the table is full, only a key busier than its least busy entry gets in,
// in place of that entry. floor and floorUntil let the hot path skip, with two atomic
// loads, an offer that would not get in: a count at most the floor, in a window that
// ends no later than the earliest window in the table.
type hotKeys struct {
	floor      atomic.Uint32
	floorUntil atomic.Int64

	mu   sync.Mutex
	keys map[string]candidate
}

type candidate struct {
	count uint32
	limit limiter.Limit
	endMS int64
}

type candidateCopy struct {
	id    string
	limit limiter.Limit
}

// offer proposes id with count hits in the window ending at end. On the hot path (try)
// it gives up when another caller holds the table: the key is offered again at its
// next power of two.
func (h *hotKeys) offer(id string, count uint32, lim limiter.Limit, end, now int64, try bool) {
	if count <= h.floor.Load() && end <= h.floorUntil.Load() {
		return
	}
	if try {
		if !h.mu.TryLock() {
			return
		}
	} else {
		h.mu.Lock()
	}
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = make(map[string]candidate, 64)
	}
	if c, ok := h.keys[id]; ok {
		if end > c.endMS || (end == c.endMS && count > c.count) {
			if lim.Count == 0 {
				lim = c.limit
			}
			h.keys[id] = candidate{count, lim, end}
		}
		return
	}
	if len(h.keys) >= Candidates {
		if h.floorUntil.Load() <= now {
			h.pruneLocked(now)
		}
		if len(h.keys) >= Candidates {
			victim, least := h.leastLocked()
			if count <= least {
				h.refloorLocked()
				return
			}
			delete(h.keys, victim)
		}
	}
	h.keys[strings.Clone(id)] = candidate{count, lim, end}
	h.refloorLocked()
}

// leastLocked returns the entry with the lowest count (the earliest window among
// equals).
func (h *hotKeys) leastLocked() (string, uint32) {
	victim, least, end := "", uint32(math.MaxUint32), int64(math.MaxInt64)
	for id, c := range h.keys {
		if c.count < least || (c.count == least && c.endMS < end) {
			victim, least, end = id, c.count, c.endMS
		}
	}
	return victim, least
}

// pruneLocked drops the entries whose window has ended.
func (h *hotKeys) pruneLocked(now int64) {
	for id, c := range h.keys {
		if c.endMS <= now {
			delete(h.keys, id)
		}
	}
	h.refloorLocked()
}

// refloorLocked sets the floor: none while the table has room, else its lowest count
// until its earliest window ends.
func (h *hotKeys) refloorLocked() {
	if len(h.keys) < Candidates {
		h.floor.Store(0)
		h.floorUntil.Store(0)
		return
	}
	least, until := uint32(math.MaxUint32), int64(math.MaxInt64)
	for _, c := range h.keys {
		least = min(least, c.count)
		until = min(until, c.endMS)
	}
	h.floor.Store(least)
	h.floorUntil.Store(until)
}

// copyLive appends the entries whose window has not ended to dst, dropping the others.
func (h *hotKeys) copyLive(dst []candidateCopy, now int64) []candidateCopy {
	h.mu.Lock()
	defer h.mu.Unlock()
	pruned := false
	for id, c := range h.keys {
		if c.endMS <= now {
			delete(h.keys, id)
			pruned = true
			continue
		}
		dst = append(dst, candidateCopy{id: id, limit: c.limit})
	}
	if pruned {
		h.refloorLocked()
	}
	return dst
}
