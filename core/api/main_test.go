package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/docs/openapi"
	"github.com/converger/edge/shared/netlimit"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

// TestMain checks every exchange of the tests against the OpenAPI documents
// (docs/openapi).
func TestMain(m *testing.M) {
	os.Exit(openapi.CheckDefaultTransport(func() int { return pgserver.RunTests(m) },
		openapi.TenantAPI, openapi.ClientAPI, openapi.Webhooks))
}

// env is a running core on a fresh database, reached over real HTTP.
type env struct {
	t      *testing.T
	base   string // http://127.0.0.1:PORT
	store  *store.Store
	pool   *pgxpool.Pool
	signer *token.Signer
	dbURL  string
}

type envOptions struct {
	limits activity.Limits // zero: the defaults
	// deps makes last changes to the dependencies; it gets the test database's URL.
	deps func(d *api.Deps, dbURL string)
}

func newEnv(t *testing.T, o envOptions) *env {
	t.Helper()
	ctx := context.Background()
	url := pgserver.NewTestDatabase(t, migrations.Up)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, _ := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	key, _ := token.GenerateKey()
	signer, _ := token.ParseSigningKey(key)
	verifier, _ := token.ParseVerifyKeys(signer.PublicKey())
	limits := o.limits
	if limits == (activity.Limits{}) {
		limits = activity.DefaultLimits
	}
	st := store.New(pool, sealer, limits)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	d := api.Deps{Store: st, Signer: signer, Verifier: verifier, PublicURL: base, Limits: limits,
		MaxUploadBytes: 1 << 20, Logger: log}
	if o.deps != nil {
		o.deps(&d, url)
	}
	app, listener := api.New(d)
	ctx, cancel := context.WithCancel(ctx)
	go listener.Run(ctx)
	// As core serve does: a listener that drains a request it answered early (413).
	go func() { _ = app.Listener(netlimit.Wrap(ln, netlimit.Options{Logger: log})) }()
	t.Cleanup(func() {
		cancel()
		_ = app.ShutdownWithTimeout(5 * time.Second)
	})
	return &env{t: t, base: base, store: st, pool: pool, signer: signer, dbURL: url}
}

var seq atomic.Int64

// tenant creates a tenant and returns it with its API key.
func (e *env) tenant() (store.Tenant, string) {
	e.t.Helper()
	t, key, err := e.store.As("test").CreateTenant(context.Background(), fmt.Sprintf("tenant-%d", seq.Add(1)))
	if err != nil {
		e.t.Fatal(err)
	}
	return t, key
}

// channel creates a channel of a tenant and returns it with its credentials.
func (e *env) channel(tenantID, typ string) (store.Channel, store.ChannelSecrets) {
	e.t.Helper()
	c, sec, err := e.store.As("test").CreateChannel(context.Background(), tenantID, fmt.Sprintf("channel-%d", seq.Add(1)), typ, "duplex")
	if err != nil {
		e.t.Fatal(err)
	}
	return c, sec
}

// response is an HTTP answer with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into v, failing the test if it is not JSON.
func (r response) json(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("body is not JSON (%d): %s", r.status, r.body)
	}
}

// do sends a request with a JSON body (nil for none) and headers.
func (e *env) do(method, path string, body any, headers map[string]string) response {
	e.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.base+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("content-type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// errorCode checks an error answer's status and envelope and returns its details.
func (r response) errorCode(t *testing.T, status int, code string) map[string]any {
	t.Helper()
	var env struct {
		Error struct {
			Code      string         `json:"code"`
			Message   string         `json:"message"`
			Details   map[string]any `json:"details"`
			RequestID string         `json:"request_id"`
		} `json:"error"`
	}
	r.json(t, &env)
	if r.status != status || env.Error.Code != code || env.Error.Message == "" || env.Error.RequestID == "" ||
		r.header.Get("x-request-id") != env.Error.RequestID {
		t.Fatalf("got %d %s, want %d %q in the envelope with a request id", r.status, r.body, status, code)
	}
	return env.Error.Details
}

func TestUnknownRouteIsJSON404(t *testing.T) {
	e := newEnv(t, envOptions{})
	r := e.do("GET", "/nope", nil, map[string]string{"x-request-id": "abc-1"})
	r.errorCode(t, 404, "not_found")
	if r.header.Get("x-request-id") != "abc-1" {
		t.Fatalf("x-request-id %q, want Envoy's", r.header.Get("x-request-id"))
	}
}
