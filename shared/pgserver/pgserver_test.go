package pgserver

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func testContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// queryString connects to url and returns the single text value of query.
func queryString(ctx context.Context, url, query string) (string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var s string
	err = conn.QueryRow(ctx, query).Scan(&s)
	return s, err
}

func mustQuery(t *testing.T, url, query string) string {
	t.Helper()
	s, err := queryString(testContext(t), url, query)
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return s
}

func mustExec(t *testing.T, url string, statements ...string) {
	t.Helper()
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range statements {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
}

func TestStartQueryStop(t *testing.T) {
	t.Parallel()
	srv, err := Start(testContext(t), Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(srv.URL(), "postgres://postgres@127.0.0.1:") {
		t.Errorf("URL = %q", srv.URL())
	}
	if got := mustQuery(t, srv.URL(), "SELECT current_user || ' ' || current_database() || ' ' || current_setting('fsync') || ' ' || current_setting('server_encoding')"); got != "postgres postgres off UTF8" {
		t.Errorf("got %q", got)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(srv.Dir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temporary data directory still there after Stop: %v", err)
	}
	if _, err := queryString(testContext(t), srv.URL(), "SELECT 'x'"); err == nil {
		t.Error("server still answers after Stop")
	}
	if err := srv.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

func TestCreateDatabase(t *testing.T) {
	t.Parallel()
	srv := StartForTest(t)
	ctx := testContext(t)
	url, err := srv.CreateDatabase(ctx, `odd "name"`)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustQuery(t, url, "SELECT current_database()"); got != `odd "name"` {
		t.Errorf("connected to %q", got)
	}
	if _, err := srv.CreateDatabase(ctx, `odd "name"`); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("creating it twice: err = %v, want already exists", err)
	}
}

var migrations atomic.Int32

func migrateForTest(ctx context.Context, url string) error {
	migrations.Add(1)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE things (id int PRIMARY KEY)")
	return err
}

func TestNewTestDatabase(t *testing.T) {
	var names [4]string
	t.Run("group", func(t *testing.T) {
		for i := range names {
			t.Run("db", func(t *testing.T) {
				t.Parallel()
				url := NewTestDatabase(t, migrateForTest)
				names[i] = mustQuery(t, url, "SELECT current_database()")
				mustExec(t, url, "INSERT INTO things VALUES (1)") // fails if another test's row were there
				if n := mustQuery(t, url, "SELECT count(*)::text FROM things"); n != "1" {
					t.Errorf("%s rows in a fresh database", n)
				}
			})
		}
		t.Run("empty", func(t *testing.T) {
			t.Parallel()
			url := NewTestDatabase(t, nil)
			if got := mustQuery(t, url, "SELECT coalesce(to_regclass('things')::text, 'none')"); got != "none" {
				t.Errorf("database without migrate has table %s", got)
			}
		})
	})
	if n := migrations.Load(); n != 1 {
		t.Errorf("migrate ran %d times, want once", n)
	}
	seen := map[string]bool{}
	for _, name := range names {
		if name == "" || seen[name] {
			t.Fatalf("database names not unique: %q", names)
		}
		seen[name] = true
	}
	// The test databases are dropped when their tests end.
	left := mustQuery(t, shared.srv.URL(), "SELECT count(*)::text FROM pg_database WHERE datname LIKE 'test\\_%'")
	if left != "0" {
		t.Errorf("%s test databases left after their tests ended", left)
	}
}

func TestPersistentDirSurvivesRestart(t *testing.T) {
	t.Parallel()
	parent, err := os.MkdirTemp("", "pgserver-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	if err := os.Chmod(parent, 0o755); err != nil { // the postgres user must reach the data dir
		t.Fatal(err)
	}
	dir := filepath.Join(parent, "data")
	srv, err := Start(testContext(t), Options{Dir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Stop() })
	url := srv.URL()
	mustExec(t, url, "CREATE TABLE kept (v text)", "INSERT INTO kept VALUES ('hello')")
	if got := mustQuery(t, url, "SHOW fsync"); got != "on" {
		t.Errorf("fsync = %s for a persistent directory", got)
	}

	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if _, err := queryString(testContext(t), url, "SELECT 'x'"); err == nil {
		t.Fatal("server answers after Shutdown")
	}
	if err := srv.Restart(testContext(t)); err != nil {
		t.Fatal(err)
	}
	if srv.URL() != url {
		t.Errorf("URL changed on Restart: %s, was %s", srv.URL(), url)
	}
	if got := mustQuery(t, url, "SELECT v FROM kept"); got != "hello" {
		t.Errorf("after Restart: %q", got)
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "PG_VERSION")); err != nil {
		t.Fatalf("persistent data directory not kept: %v", err)
	}
	srv2, err := Start(testContext(t), Options{Dir: dir, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Stop()
	if got := mustQuery(t, srv2.URL(), "SELECT v FROM kept"); got != "hello" {
		t.Errorf("after a new Start on the same directory: %q", got)
	}
}

func TestRestartTemporaryServer(t *testing.T) {
	t.Parallel()
	srv := StartForTest(t)
	mustExec(t, srv.URL(), "CREATE TABLE t (v int)")
	if err := srv.Restart(testContext(t)); err != nil {
		t.Fatal(err)
	}
	mustExec(t, srv.URL(), "INSERT INTO t VALUES (1)")
}

// A paused server answers nothing, open connections included, until it is resumed; a
// paused server still stops.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	srv := StartForTest(t)
	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	qctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err = conn.Ping(qctx)
	cancel()
	if err == nil {
		t.Fatal("a paused server answered")
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := mustQuery(t, srv.URL(), "SELECT 1"); got != "1" {
		t.Fatalf("after Resume: %q", got)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := srv.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a paused server took %v to stop", d)
	}
	if err := srv.Pause(); err == nil {
		t.Fatal("Pause of a stopped server succeeded")
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	t.Run("no binaries", func(t *testing.T) {
		t.Parallel()
		_, err := Start(testContext(t), Options{BinDir: t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), "initdb and postgres not found in") {
			t.Errorf("err = %v", err)
		}
	})
	t.Run("port taken", func(t *testing.T) {
		t.Parallel()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		_, err = Start(testContext(t), Options{Port: l.Addr().(*net.TCPAddr).Port})
		if err == nil || !errors.Is(err, errAddrInUse) || !strings.Contains(err.Error(), "could not create any TCP/IP sockets") {
			t.Errorf("err = %v, want one that includes the server's log", err)
		}
	})
	t.Run("unreachable dir", func(t *testing.T) {
		t.Parallel()
		if os.Geteuid() != 0 {
			t.Skip("only root runs the server as another user")
		}
		_, err := Start(testContext(t), Options{Dir: filepath.Join(t.TempDir(), "data")}) // t.TempDir's parent is 0700
		if err == nil || !strings.Contains(err.Error(), "the postgres user cannot reach") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestTestDatabaseName(t *testing.T) {
	name := testDatabaseName("TestX/" + strings.Repeat("Ünïcode ", 20))
	if len(name) != 63 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
		t.Errorf("name %q (%d bytes)", name, len(name))
	}
}
