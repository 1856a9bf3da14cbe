package pgserver

import (
	"context"
	"fmt"
	"os"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// shared is the one server of a test binary, started by the first NewTestDatabase and
// stopped when RunTests returns.
var shared struct {
	sync.Mutex
	running   bool // inside RunTests
	srv       *Server
	err       error
	templates map[uintptr]template // by migrate function
}

type template struct {
	name string
	err  error
}

var testDBs atomic.Int64

// RunTests runs the tests of a package that uses NewTestDatabase and then stops the
// package's shared server, if a test started it. Use it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }
func RunTests(m *testing.M) int {
	shared.Lock()
	shared.running = true
	shared.Unlock()

	code := m.Run()

	shared.Lock()
	defer shared.Unlock()
	shared.running = false
	if shared.srv != nil {
		if err := shared.srv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
		shared.srv = nil
	}
	return code
}

// NewTestDatabase creates a fresh database for the test on the package's shared server and
// returns its URL; the database is dropped (WITH (FORCE)) when the test ends. If migrate is
// not nil, it runs once per test binary into a template database that every later database
// is copied from, so migrate must close its connections before it returns. Templates are
// keyed by migrate's code pointer: pass a named function such as migrations.Up, not
// closures from one function literal that differ in what they capture.
// Safe for parallel tests; the package's TestMain must use RunTests.
func NewTestDatabase(t testing.TB, migrate func(ctx context.Context, url string) error) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	shared.Lock()
	srv, tpl, err := sharedServer(ctx, migrate)
	shared.Unlock()
	if err != nil {
		t.Fatal(err)
	}

	name := testDatabaseName(t.Name())
	url, err := srv.createDatabase(ctx, name, tpl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.execSQL(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgserver: dropping test database %s: %v", name, err)
		}
	})
	return url
}

// sharedServer starts the shared server and migrates the template for migrate if needed.
// Errors are kept, so that a failure costs one attempt, not one per test. Caller holds shared.
func sharedServer(ctx context.Context, migrate func(context.Context, string) error) (*Server, string, error) {
	if !shared.running {
		return nil, "", fmt.Errorf("pgserver: NewTestDatabase needs TestMain to call pgserver.RunTests, which stops the server")
	}
	if shared.srv == nil && shared.err == nil {
		shared.srv, shared.err = Start(ctx, Options{})
	}
	if shared.err != nil {
		return nil, "", shared.err
	}
	if migrate == nil {
		return shared.srv, "", nil
	}
	key := reflect.ValueOf(migrate).Pointer()
	tpl, ok := shared.templates[key]
	if !ok {
		tpl.name = fmt.Sprintf("template_%d", len(shared.templates)+1)
		tpl.err = migrateTemplate(ctx, shared.srv, tpl.name, migrate)
		if shared.templates == nil {
			shared.templates = make(map[uintptr]template)
		}
		shared.templates[key] = tpl
	}
	return shared.srv, tpl.name, tpl.err
}

func migrateTemplate(ctx context.Context, srv *Server, name string, migrate func(context.Context, string) error) error {
	url, err := srv.createDatabase(ctx, name, "")
	if err != nil {
		return err
	}
	if err := migrate(ctx, url); err != nil {
		return fmt.Errorf("pgserver: migrating template database: %w", err)
	}
	// Refusing connections (and ending any that migrate left open; name is ours, plain
	// ASCII) keeps CREATE DATABASE ... TEMPLATE from failing on a stray session.
	if err := srv.execSQL(ctx, "ALTER DATABASE "+name+" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
		"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '"+name+"'"); err != nil {
		return fmt.Errorf("pgserver: marking template database: %w", err)
	}
	return nil
}

// testDatabaseName is unique within the test binary and shows which test it belongs to.
func testDatabaseName(testName string) string {
	name := []byte(fmt.Sprintf("test_%d_", testDBs.Add(1)))
	for _, r := range strings.ToLower(testName) {
		if len(name) == 63 { // PostgreSQL's identifier limit
			break
		}
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			name = append(name, byte(r))
		} else {
			name = append(name, '_')
		}
	}
	return string(name)
}

// StartForTest starts a private temporary server for one test, for tests that stop and
// restart PostgreSQL (Shutdown, Restart); it is stopped and removed when the test ends.
func StartForTest(t testing.TB) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := Start(ctx, Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Stop(); err != nil {
			t.Errorf("pgserver: %v", err)
		}
	})
	return srv
}
