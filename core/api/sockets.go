package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"sync"
	"sync/atomic"
	"time"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterclient"
)

// Bounds of the legacy WebSockets of one core.
const (
	// legacyMaxSocketsPerToken is how many sockets one legacy token may hold at once.
	legacyMaxSocketsPerToken = 5
	// legacyMaxSocketsPerConversation is how many sockets one conversation may have.
	legacyMaxSocketsPerConversation = 50
	// legacySlotGrace releases a slot whose upgrade never started a connection.
	legacySlotGrace = 30 * time.Second
	// legacyLimiterTimeout bounds the Limiter call that counts an activity.
	legacyLimiterTimeout = time.Second
)

// socketCounts counts the open legacy sockets by token and by conversation.
type socketCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func newSocketCounts() *socketCounts { return &socketCounts{n: map[string]int{}} }

// socketSlot is one socket's place in the counts, released once.
type socketSlot struct {
	counts  *socketCounts
	keys    [2]string
	once    sync.Once
	started atomic.Bool
}

// acquire takes a slot for a socket of token on conversation conv, or reports which
// bound is reached ("token" or "conversation").
func (sc *socketCounts) acquire(token, conv string) (*socketSlot, string) {
	sum := sha256.Sum256([]byte(token))
	keys := [2]string{"token:" + hex.EncodeToString(sum[:16]), "conversation:" + conv}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	switch {
	case sc.n[keys[0]] >= legacyMaxSocketsPerToken:
		return nil, "token"
	case sc.n[keys[1]] >= legacyMaxSocketsPerConversation:
		return nil, "conversation"
	}
	for _, k := range keys {
		sc.n[k]++
	}
	return &socketSlot{counts: sc, keys: keys}, ""
}

// release gives the slot back (once).
func (s *socketSlot) release() {
	s.once.Do(func() {
		s.counts.mu.Lock()
		defer s.counts.mu.Unlock()
		for _, k := range s.keys {
			if s.counts.n[k]--; s.counts.n[k] <= 0 {
				delete(s.counts.n, k)
			}
		}
	})
}

// countActivity counts one activity of a tenant in activity_create, as the sidecar does
// for the REST APIs. It fails open: activity_create protects no credential, and a
// Limiter that does not answer (logged once per outage) must not stop the conversation.
func (s *server) countActivity(ctx context.Context, tenantID string) (limiterclient.Result, bool) {
	if s.Limiter == nil {
		return limiterclient.Result{Allowed: true}, true
	}
	ctx, cancel := context.WithTimeout(ctx, legacyLimiterTimeout)
	defer cancel()
	r, err := s.Limiter.Check(ctx, buckets.ActivityCreate, tenantID, 1)
	if err != nil {
		if s.limiterFailing.CompareAndSwap(false, true) {
			s.Logger.Warn("the Limiter did not answer: legacy WebSocket activities are not counted until it does (fail open)", "error", err)
		}
		return limiterclient.Result{Allowed: true}, true
	}
	if s.limiterFailing.CompareAndSwap(true, false) {
		s.Logger.Info("the Limiter answers again: legacy WebSocket activities are counted")
	}
	return r, r.Allowed
}
