package login

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterclient"
	"github.com/converger/edge/sidecar/limiter"
)

// Limiter is the sidecar's Limiter service as the login pages use it;
// *limiterclient.Client (LIMITER_ADDR) and *LocalLimiter implement it. Keys are the part
// of the documented key after "<bucket>:" ("203.0.113.7" for login_ip,
// "admin:alice@example.com" for login_account). Logins Take an attempt before checking
// the secret and Refund it when it should not count; password resets Check; Peek shows
// a count.
type Limiter interface {
	Check(ctx context.Context, bucket, key string, hits uint32) (limiterclient.Result, error)
	Peek(ctx context.Context, bucket, key string) (limiterclient.Result, error)
	Take(ctx context.Context, bucket, key string, hits uint32) (limiterclient.Result, error)
	Refund(ctx context.Context, bucket, key string, hits uint32) (limiterclient.Result, error)
}

// LocalLimiter counts in this process with the limiter package and the built-in
// buckets' limits, for a core without LIMITER_ADDR. Its counts are not shared with
// other cores or the sidecars.
type LocalLimiter struct {
	l    *limiter.Limiter
	stop chan struct{}
}

// NewLocalLimiter returns a local limiter on the clock now (time.Now when nil) that
// sweeps expired windows every minute until Close.
func NewLocalLimiter(now func() time.Time) *LocalLimiter {
	l := &LocalLimiter{l: limiter.New(limiter.Options{Now: now}), stop: make(chan struct{})}
	go l.l.RunSweeper(time.Minute, l.stop)
	return l
}

// Close stops the sweeper.
func (l *LocalLimiter) Close() { close(l.stop) }

// Check counts hits and decides.
func (l *LocalLimiter) Check(_ context.Context, bucket, key string, hits uint32) (limiterclient.Result, error) {
	return l.do(bucket, key, func(k limiter.Key, lim buckets.Limit) limiter.Result { return l.l.Check(k, max(hits, 1), lim) })
}

// Peek decides without counting.
func (l *LocalLimiter) Peek(_ context.Context, bucket, key string) (limiterclient.Result, error) {
	return l.do(bucket, key, func(k limiter.Key, lim buckets.Limit) limiter.Result { return l.l.Peek(k, lim) })
}

// Take counts only what fits, and decides.
func (l *LocalLimiter) Take(_ context.Context, bucket, key string, hits uint32) (limiterclient.Result, error) {
	return l.do(bucket, key, func(k limiter.Key, lim buckets.Limit) limiter.Result { return l.l.Take(k, max(hits, 1), lim) })
}

// Refund forgives hits taken in the current window.
func (l *LocalLimiter) Refund(_ context.Context, bucket, key string, hits uint32) (limiterclient.Result, error) {
	return l.do(bucket, key, func(k limiter.Key, lim buckets.Limit) limiter.Result { return l.l.Refund(k, max(hits, 1), lim) })
}

func (l *LocalLimiter) do(bucket, key string, op func(limiter.Key, buckets.Limit) limiter.Result) (limiterclient.Result, error) {
	b, ok := buckets.Lookup(bucket)
	if !ok {
		return limiterclient.Result{}, fmt.Errorf("unknown bucket %q", bucket)
	}
	r := op(limiter.Key{Bucket: l.l.Bucket(bucket), ID: key}, b.Default)
	return limiterclient.Result{
		Allowed:    r.Allowed,
		Count:      uint64(r.Count),
		Limit:      uint64(r.Limit.Count),
		Window:     r.Limit.Window,
		RetryAfter: time.Duration(r.RetryAfterMS) * time.Millisecond,
	}, nil
}

// maxKeyLength is the longest key the sidecar's Limiter accepts.
const maxKeyLength = 512

// boundKey returns key, or a digest of it when it is longer than the Limiter accepts
// (a tenant name of many multi-byte characters).
func boundKey(key string) string {
	if len(key) <= maxKeyLength {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}
