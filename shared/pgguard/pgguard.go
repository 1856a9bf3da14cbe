// Package pgguard bounds what PostgreSQL can do to a server: a deadline on every query
// and pool acquisition, and a monitor that tells within a second or two that the
// database is down or hung, so that callers answer at once instead of waiting on it,
// and that it is back.
package pgguard

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/converger/edge/shared/tracing"
)

// Options tune a Monitor. Zero values take the defaults.
type Options struct {
	// Interval is how often the monitor probes a database it believes up (1 s).
	Interval time.Duration
	// Timeout bounds one probe (1 s): a database that takes longer is down.
	Timeout time.Duration
	// OpenOnFailure marks the database down as soon as a call fails (Failed), before a
	// probe confirms it: for callers that can decide without the database. Otherwise a
	// failed call starts a probe at once, and the probe decides, so that one slow query
	// of a loaded server does not take the database away from every request.
	OpenOnFailure bool
	// Logger receives the transitions (slog.Default() when nil); DownMessage and
	// UpMessage are their messages.
	Logger                 *slog.Logger
	DownMessage, UpMessage string
}

// Monitor follows whether the database answers. Its probe runs on a connection of its
// own, never the pool's: a pool exhausted by a burst of requests is not an outage.
type Monitor struct {
	ping func(context.Context) error
	o    Options
	log  *slog.Logger
	poke chan struct{}

	down     atomic.Bool
	probes   atomic.Uint64
	failures atomic.Uint64 // failed probes
	changes  atomic.Uint64 // transitions to down
}

// NewMonitor returns a monitor that probes with ping; call Run to start probing. It
// starts up.
func NewMonitor(ping func(context.Context) error, o Options) *Monitor {
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DownMessage == "" {
		o.DownMessage = "database unavailable"
	}
	if o.UpMessage == "" {
		o.UpMessage = "database reachable again"
	}
	return &Monitor{ping: ping, o: o, log: o.Logger, poke: make(chan struct{}, 1)}
}

// Up reports whether the database answered the last probe (and, with OpenOnFailure,
// no call failed since).
func (m *Monitor) Up() bool { return !m.down.Load() }

// Failed reports a database call that failed for a reason that may be the database's
// (see Unavailable): it starts a probe at once, and with OpenOnFailure marks the
// database down until a probe succeeds.
func (m *Monitor) Failed(err error) {
	if m.o.OpenOnFailure {
		m.setDown(err)
	}
	select {
	case m.poke <- struct{}{}:
	default:
	}
}

// Stats are the monitor's counters.
type Stats struct {
	Probes, FailedProbes, Outages uint64
}

// Stats returns the monitor's counters.
func (m *Monitor) Stats() Stats {
	return Stats{Probes: m.probes.Load(), FailedProbes: m.failures.Load(), Outages: m.changes.Load()}
}

// Run probes until ctx ends: every Interval while the database is up, at once when a
// call failed, and while it is down with backoff from 100 ms up to Interval.
func (m *Monitor) Run(ctx context.Context) {
	const firstRetry = 100 * time.Millisecond
	retry := firstRetry
	timer := time.NewTimer(m.o.Interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-m.poke:
			timer.Stop()
		}
		pctx, cancel := context.WithTimeout(ctx, m.o.Timeout)
		err := m.ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		m.probes.Add(1)
		next := m.o.Interval
		if err != nil {
			m.failures.Add(1)
			m.setDown(err)
			next, retry = retry, min(2*retry, m.o.Interval)
		} else {
			retry = firstRetry
			if m.down.CompareAndSwap(true, false) {
				m.log.Info(m.o.UpMessage)
			}
		}
		timer.Reset(next)
	}
}

func (m *Monitor) setDown(err error) {
	if m.down.CompareAndSwap(false, true) {
		m.changes.Add(1)
		m.log.Warn(m.o.DownMessage, "error", err)
	}
}

// ConnPing returns a ping over a connection of its own to the database of cfg, opened
// when needed and replaced after a failure. Calls are serialised.
func ConnPing(cfg *pgx.ConnConfig) func(context.Context) error {
	cfg = cfg.Copy()
	cfg.Tracer = nil
	var mu sync.Mutex
	var conn *pgx.Conn
	return func(ctx context.Context) error {
		mu.Lock()
		defer mu.Unlock()
		if conn == nil {
			c, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				return err
			}
			conn = c
		}
		if err := conn.Ping(ctx); err != nil {
			closeCtx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			_ = conn.Close(closeCtx)
			cancel()
			conn = nil
			return err
		}
		return nil
	}
}

// Unavailable reports whether err means that the database did not answer: it could
// not be reached, the connection broke, or a deadline passed. A query's own failure (a
// constraint, a syntax error) and a caller that gave up (context.Canceled) are not.
func Unavailable(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, context.DeadlineExceeded), pgconn.Timeout(err):
		return true
	case errors.Is(err, context.Canceled):
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Connection exceptions, shutdowns, "the database system is starting up",
		// too many connections.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" ||
			pe.Code == "57P03" || pe.Code == "53300"
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || pgconn.SafeToRetry(err)
}

// Deadlines gives every query of a pool's connections (Query, QueryRow, Exec, a
// transaction's begin and commit) at most a query timeout, and every acquisition of a
// connection at most an acquire timeout, and reports the failures that mean the
// database is unavailable to m (nil: none). Install it with Configure.
//
// The acquire timeout is the pool's queue: under overload, requests wait there for one
// of the few connections, and one that cannot get a connection in time fails at once
// (an answer the caller can give, 503) rather than waiting past its client's patience
// and working for nobody. Such a wait is overload, not an outage: it is counted apart
// and does not alert the monitor.
type Deadlines struct {
	query, acquire time.Duration
	m              *Monitor
	errors         atomic.Uint64
	poolTimeouts   atomic.Uint64
}

// Configure sets cfg up with a deadline of query on every query and new connection and
// of acquire on every pool acquisition, reporting to m, and returns the tracer (for its
// counters).
func Configure(cfg *pgxpool.Config, query, acquire time.Duration, m *Monitor) *Deadlines {
	d := &Deadlines{query: query, acquire: acquire, m: m}
	cfg.ConnConfig.Tracer = d
	cfg.ConnConfig.ConnectTimeout = query
	return d
}

// Errors returns how many queries and acquisitions failed for a reason of the
// database's.
func (d *Deadlines) Errors() uint64 { return d.errors.Load() }

// PoolTimeouts returns how many acquisitions found no free connection in time.
func (d *Deadlines) PoolTimeouts() uint64 { return d.poolTimeouts.Load() }

type cancelKey struct{}

// errPoolWait is the cause of an acquisition's deadline.
var errPoolWait = errors.New("no free database connection within the acquire timeout")

// start bounds ctx; end, given the returned context, releases the bound.
func (d *Deadlines) start(ctx context.Context, timeout time.Duration, cause error) context.Context {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, cause)
	return context.WithValue(ctx, cancelKey{}, cancel)
}

func (d *Deadlines) end(ctx context.Context, err error) {
	poolWait := err != nil && errors.Is(context.Cause(ctx), errPoolWait)
	if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
	switch {
	case poolWait:
		d.poolTimeouts.Add(1)
	case Unavailable(err):
		d.errors.Add(1)
		if d.m != nil {
			d.m.Failed(err)
		}
	}
}

// TraceQueryStart bounds a query, and while tracing is on starts its span when the
// query is part of a traced request (background work, a cache's refresh or a LISTEN,
// starts no trace of its own).
func (d *Deadlines) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if tracing.Enabled() && trace.SpanContextFromContext(ctx).IsValid() {
		// The statement's text only: its arguments are never put in a trace.
		var span trace.Span
		ctx, span = tracing.Start(ctx, operation(data.SQL), trace.SpanKindClient,
			attribute.String("db.system.name", "postgresql"), attribute.String("db.query.text", data.SQL))
		ctx = context.WithValue(ctx, spanKey{}, span)
	}
	return d.start(ctx, d.query, context.DeadlineExceeded)
}

// TraceQueryEnd releases a query's bound and reports its failure, and ends its span.
func (d *Deadlines) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	d.end(ctx, data.Err)
	if span, ok := ctx.Value(spanKey{}).(trace.Span); ok {
		if data.Err != nil {
			span.SetStatus(otelcodes.Error, "query failed")
		}
		span.End()
	}
}

type spanKey struct{}

// operation is a statement's first word, the span's name: SELECT, INSERT, WITH, …
func operation(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexFunc(sql, unicode.IsSpace); i > 0 {
		sql = sql[:i]
	}
	if len(sql) > 16 {
		sql = sql[:16]
	}
	return strings.ToUpper(sql)
}

// TraceAcquireStart bounds an acquisition.
func (d *Deadlines) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return d.start(ctx, d.acquire, errPoolWait)
}

// TraceAcquireEnd releases an acquisition's bound and reports its failure.
func (d *Deadlines) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, data pgxpool.TraceAcquireEndData) {
	d.end(ctx, data.Err)
}
