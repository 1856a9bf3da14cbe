// Package limiterclient is the Go client of the sidecar's Limiter gRPC service: Check,
// Peek, Record, Take and Refund on a bucket and key, for the core's login lockout,
// password resets and the activities of the legacy WebSocket; and the console's view of
// the sidecar (buckets, minute counts, busiest keys, cluster).
package limiterclient

import (
	"context"
	"crypto/tls"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/converger/edge/shared/limiterpb"
	"github.com/converger/edge/shared/tracing"
)

// Result is the answer of one operation.
type Result struct {
	Allowed    bool
	Count      uint64
	Limit      uint64
	Window     time.Duration
	RetryAfter time.Duration
}

// RetryAfterSeconds returns RetryAfter in whole seconds, rounded up, at least 1: the
// value of a retry-after header.
func (r Result) RetryAfterSeconds() int64 {
	s := int64((r.RetryAfter + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Client calls one sidecar.
type Client struct {
	conn *grpc.ClientConn
	api  limiterpb.LimiterClient
}

// New returns a client of the sidecar at addr (host:port), in plain text unless opts
// has WithTLS. The connection is made lazily and kept; the sidecar's gRPC port listens
// on loopback by default.
func New(addr string, opts ...grpc.DialOption) (*Client, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(tracing.UnaryClientInterceptor())}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, api: limiterpb.NewLimiterClient(conn)}, nil
}

// WithTLS is the option of a client that speaks TLS with cfg; nil: plain text.
func WithTLS(cfg *tls.Config) grpc.DialOption {
	if cfg == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg))
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// State is the connection's state as gRPC names it (IDLE, CONNECTING, READY,
// TRANSIENT_FAILURE, SHUTDOWN), for readiness reports.
func (c *Client) State() string { return c.conn.GetState().String() }

// Check counts hits on bucket/key and decides.
func (c *Client) Check(ctx context.Context, bucket, key string, hits uint32) (Result, error) {
	return result(c.api.Check(ctx, &limiterpb.LimitRequest{Bucket: bucket, Key: key, Hits: hits}))
}

// Peek decides on bucket/key without counting.
func (c *Client) Peek(ctx context.Context, bucket, key string) (Result, error) {
	return result(c.api.Peek(ctx, &limiterpb.LimitRequest{Bucket: bucket, Key: key}))
}

// Record counts hits on bucket/key without deciding.
func (c *Client) Record(ctx context.Context, bucket, key string, hits uint32) (Result, error) {
	return result(c.api.Record(ctx, &limiterpb.LimitRequest{Bucket: bucket, Key: key, Hits: hits}))
}

// Take counts hits on bucket/key only when they fit within the limit, and decides.
func (c *Client) Take(ctx context.Context, bucket, key string, hits uint32) (Result, error) {
	return result(c.api.Take(ctx, &limiterpb.LimitRequest{Bucket: bucket, Key: key, Hits: hits}))
}

// Refund forgives hits taken from bucket/key in the current window.
func (c *Client) Refund(ctx context.Context, bucket, key string, hits uint32) (Result, error) {
	return result(c.api.Refund(ctx, &limiterpb.LimitRequest{Bucket: bucket, Key: key, Hits: hits}))
}

func result(r *limiterpb.LimitResponse, err error) (Result, error) {
	if err != nil {
		return Result{}, err
	}
	return Result{
		Allowed:    r.GetAllowed(),
		Count:      r.GetCount(),
		Limit:      r.GetLimit(),
		Window:     time.Duration(r.GetWindowMs()) * time.Millisecond,
		RetryAfter: time.Duration(r.GetRetryAfterMs()) * time.Millisecond,
	}, nil
}

// The console's view of the sidecar (the answers are the service's messages, described
// in shared/limiterpb/limiter.proto).

// Buckets returns the buckets with their built-in and installation limits.
func (c *Client) Buckets(ctx context.Context) (*limiterpb.BucketsResponse, error) {
	return c.api.Buckets(ctx, &limiterpb.BucketsRequest{})
}

// Traffic returns each bucket's allowed and denied decisions of every minute of the
// last hour, every member's in a cluster.
func (c *Client) Traffic(ctx context.Context) (*limiterpb.TrafficResponse, error) {
	return c.api.Traffic(ctx, &limiterpb.TrafficRequest{})
}

// Busiest returns up to top (1 to 100; 0: 10) of the busiest keys of each bucket, or of
// one bucket when bucket is not empty.
func (c *Client) Busiest(ctx context.Context, top uint32, bucket string) (*limiterpb.BusiestResponse, error) {
	return c.api.Busiest(ctx, &limiterpb.BusiestRequest{Top: top, Bucket: bucket})
}

// Cluster returns the backend, this node and the cluster's live members.
func (c *Client) Cluster(ctx context.Context) (*limiterpb.ClusterResponse, error) {
	return c.api.Cluster(ctx, &limiterpb.ClusterRequest{})
}
