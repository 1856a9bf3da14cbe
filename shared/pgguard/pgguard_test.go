package pgguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/shared/pgserver"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not %s within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

func newPool(t *testing.T, url string, timeout time.Duration, m *Monitor) (*pgxpool.Pool, *Deadlines) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 2
	d := Configure(cfg, timeout, time.Second, m)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, d
}

// Every query and acquisition gives up at the deadline, whatever the caller's context.
func TestDeadlines(t *testing.T) {
	t.Parallel()
	url := pgserver.NewTestDatabase(t, nil)
	m := NewMonitor(func(context.Context) error { return nil }, Options{Logger: quiet})
	pool, d := newPool(t, url, 300*time.Millisecond, m)
	ctx := context.Background()

	start := time.Now()
	_, err := pool.Exec(ctx, "SELECT pg_sleep(10)")
	if err == nil || !Unavailable(err) {
		t.Fatalf("a query past its deadline: %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("a query with a 300 ms deadline took %v", took)
	}
	var n int
	start = time.Now()
	err = pool.QueryRow(ctx, "SELECT 1 FROM pg_sleep(10)").Scan(&n)
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("QueryRow past its deadline: %v after %v", err, time.Since(start))
	}
	// A transaction's statements each have the deadline.
	start = time.Now()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT pg_sleep(10)")
		return err
	})
	if err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("a transaction past its deadline: %v after %v", err, time.Since(start))
	}
	// Acquisitions too: both connections held, a third waits at most the acquire
	// timeout, and that is overload, not an outage.
	c1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Release()
	c2, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Release()
	// (The transaction's rollback on its broken connection may count too.)
	counted := d.Errors()
	if counted < 3 {
		t.Fatalf("%d errors counted, want at least 3", counted)
	}
	start = time.Now()
	if _, err := pool.Acquire(ctx); err == nil || time.Since(start) > 3*time.Second {
		t.Fatalf("an acquisition from an exhausted pool: %v after %v", err, time.Since(start))
	}
	if d.PoolTimeouts() != 1 || d.Errors() != counted {
		t.Fatalf("pool timeouts %d, errors %d: want the wait counted as a pool timeout only", d.PoolTimeouts(), d.Errors())
	}
	// Quick queries are not bothered, and a query's own failure is no outage.
	c1.Release()
	c2.Release()
	if err := pool.QueryRow(ctx, "SELECT 41 + 1").Scan(&n); err != nil || n != 42 {
		t.Fatalf("a quick query: %d %v", n, err)
	}
	if _, err := pool.Exec(ctx, "SELECT * FROM no_such_table"); err == nil || Unavailable(err) {
		t.Fatalf("a query's own error: %v (unavailable %v)", err, Unavailable(err))
	}
	if d.Errors() != counted {
		t.Fatalf("%d errors counted, want still %d", d.Errors(), counted)
	}
}

// The monitor notices an outage within a second or two, a stopped and a hung server
// alike, with no traffic at all, and the recovery by itself.
func TestMonitorOutages(t *testing.T) {
	t.Parallel()
	srv := pgserver.StartForTest(t)
	cfg, err := pgx.ParseConfig(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	m := NewMonitor(ConnPing(cfg), Options{Interval: 200 * time.Millisecond, Timeout: 300 * time.Millisecond, Logger: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx)
	waitFor(t, 5*time.Second, "probing", func() bool { return m.Stats().Probes > 0 })
	if !m.Up() {
		t.Fatal("down at the start")
	}

	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	took := waitFor(t, 3*time.Second, "down after a shutdown", func() bool { return !m.Up() })
	t.Logf("shutdown noticed in %v", took)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "up after the restart", m.Up)

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	took = waitFor(t, 3*time.Second, "down while hung", func() bool { return !m.Up() })
	t.Logf("hang noticed in %v", took)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "up after the hang", m.Up)
	if s := m.Stats(); s.Outages != 2 || s.FailedProbes == 0 {
		t.Fatalf("stats %+v, want 2 outages", s)
	}
}

// A failed call starts a probe at once; without OpenOnFailure only the probe decides,
// with it the call does.
func TestMonitorFailed(t *testing.T) {
	t.Parallel()
	fail := make(chan error, 10)
	ping := func(context.Context) error {
		select {
		case err := <-fail:
			return err
		default:
			return nil
		}
	}
	for _, open := range []bool{false, true} {
		t.Run(fmt.Sprint("OpenOnFailure=", open), func(t *testing.T) {
			m := NewMonitor(ping, Options{Interval: time.Hour, OpenOnFailure: open, Logger: quiet})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			// The failure before the monitor runs, so that its probe (which succeeds)
			// cannot bring it up again before the failure's own effect is seen; the
			// probe it asks for waits in poke.
			m.Failed(errors.New("a slow query"))
			if m.Up() == open {
				t.Fatalf("up %v right after a failure", m.Up())
			}
			go m.Run(ctx)
			waitFor(t, 2*time.Second, "a probe after the failure", func() bool { return m.Stats().Probes == 1 })
			waitFor(t, 2*time.Second, "up", m.Up)
			fail <- errors.New("refused")
			m.Failed(errors.New("refused"))
			waitFor(t, 2*time.Second, "down after a failed probe", func() bool { return !m.Up() })
			waitFor(t, 2*time.Second, "up after the next probe", m.Up) // retried within 100 ms
		})
	}
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{context.Canceled, false},
		{fmt.Errorf("query: %w", context.DeadlineExceeded), true},
		{&net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{io.ErrUnexpectedEOF, true},
		{&pgconn.PgError{Code: "57P01"}, true},
		{&pgconn.PgError{Code: "08006"}, true},
		{&pgconn.PgError{Code: "23505"}, false},
		{pgx.ErrNoRows, false},
		{errors.New("something else"), false},
	} {
		if got := Unavailable(c.err); got != c.want {
			t.Errorf("Unavailable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
