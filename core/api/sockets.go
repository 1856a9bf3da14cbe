package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/converger/edge/shared/apierror"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterclient"
)

// Bounds of the long-lived connections of one core: the legacy WebSockets per token and
// per conversation, the Direct Line streams per token and per conversation
// (CORE_MAX_STREAMS_PER_TOKEN, CORE_MAX_STREAMS_PER_CONVERSATION), and both together per
// client address (CORE_MAX_SOCKETS_PER_IP). The client API's polling (GET activities)
// answers at once and holds nothing open.
const (
	// legacyMaxSocketsPerToken is how many sockets one legacy token may hold at once.
	legacyMaxSocketsPerToken = 5
	// legacyMaxSocketsPerConversation is how many sockets one conversation may have.
	legacyMaxSocketsPerConversation = 50
	// The defaults of the streams' bounds and the per-address one, as
	// config.DefaultBounds.
	defaultMaxStreamsPerToken        = 10
	defaultMaxStreamsPerConversation = 50
	defaultMaxSocketsPerIP           = 256
	// legacySlotGrace releases a slot whose upgrade never started a connection.
	legacySlotGrace = 30 * time.Second
	// legacyLimiterTimeout bounds the Limiter call that counts an activity.
	legacyLimiterTimeout = time.Second
)

// The bounds a socket may be refused by, as metric labels and in the answer.
const (
	boundLegacyToken        = "legacy_token"
	boundLegacyConversation = "legacy_conversation"
	boundStreamToken        = "stream_token"
	boundStreamConversation = "stream_conversation"
	boundClientIP           = "client_ip"
)

var socketBounds = []string{boundLegacyToken, boundLegacyConversation, boundStreamToken, boundStreamConversation, boundClientIP}

// socketCounts counts the open long-lived connections by key.
type socketCounts struct {
	mu      sync.Mutex
	n       map[string]int
	open    atomic.Int64
	refused map[string]*atomic.Uint64 // by bound
}

func newSocketCounts() *socketCounts {
	sc := &socketCounts{n: map[string]int{}, refused: map[string]*atomic.Uint64{}}
	for _, b := range socketBounds {
		sc.refused[b] = new(atomic.Uint64)
	}
	return sc
}

// socketKey is one bound a socket counts against.
type socketKey struct {
	bound, key string
	limit      int
}

// socketSlot is one socket's place in the counts, released once.
type socketSlot struct {
	counts  *socketCounts
	keys    []string
	once    sync.Once
	started atomic.Bool
}

// tokenKey names a token in the counts without keeping it.
func tokenKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:16])
}

// acquire takes a slot for a socket counted against every key, or reports the first
// bound reached (and its limit).
func (sc *socketCounts) acquire(keys ...socketKey) (*socketSlot, socketKey) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, k := range keys {
		if sc.n[k.bound+":"+k.key] >= k.limit {
			sc.refused[k.bound].Add(1)
			return nil, k
		}
	}
	slot := &socketSlot{counts: sc}
	for _, k := range keys {
		name := k.bound + ":" + k.key
		sc.n[name]++
		slot.keys = append(slot.keys, name)
	}
	sc.open.Add(1)
	return slot, socketKey{}
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
		s.counts.open.Add(-1)
	})
}

// releaseUnstarted gives back, after a grace, a slot whose connection never started
// (the handshake's write failed), when the upgrade was answered; at once otherwise.
func (s *socketSlot) releaseUnstarted(upgraded bool) {
	if !upgraded {
		s.release()
		return
	}
	time.AfterFunc(legacySlotGrace, func() {
		if !s.started.Load() {
			s.release()
		}
	})
}

// refuseSocket answers 429 for a bound reached, at once.
func refuseSocket(c *fiber.Ctx, k socketKey) error {
	c.Set(fiber.HeaderRetryAfter, "1")
	what := map[string]string{boundLegacyToken: "token", boundStreamToken: "token", boundLegacyConversation: "conversation",
		boundStreamConversation: "conversation", boundClientIP: "client address"}[k.bound]
	return fail(c, apierror.RateLimited.WithMessage(fmt.Sprintf(
		"Too many open connections for this %s (at most %d); close one first.", what, k.limit)),
		map[string]any{"bound": k.bound, "limit": k.limit})
}

// registerSocketMetrics exposes the counts.
func (s *server) registerSocketMetrics() {
	s.Metrics.GaugeFunc("converger_core_sockets", "Open WebSockets (Direct Line streams and legacy sockets).",
		func() float64 { return float64(s.sockets.open.Load()) })
	for _, b := range socketBounds {
		n := s.sockets.refused[b]
		s.Metrics.CounterFunc("converger_core_sockets_refused_"+b+"_total", "WebSocket upgrades refused 429 by the bound on open sockets per "+strings.ReplaceAll(b, "_", " ")+".",
			func() float64 { return float64(n.Load()) })
	}
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
