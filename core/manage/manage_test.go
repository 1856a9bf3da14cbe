package manage_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/manage"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/pgserver"
	sidecartenants "github.com/converger/edge/sidecar/tenants"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// cli runs manage.Run against a fresh migrated database.
type cli struct {
	t      *testing.T
	ctx    context.Context
	url    string
	encKey string
	env    map[string]string
	pool   *pgxpool.Pool
	st     *store.Store
	mailer mail.Sender // Env.Mailer
}

func newCLI(t *testing.T) *cli {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	url := pgserver.NewTestDatabase(t, migrations.Up)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	key := credentials.GenerateEncryptionKey()
	sealer, err := credentials.ParseEncryptionKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return &cli{t: t, ctx: ctx, url: url, encKey: key, pool: pool, st: store.New(pool, sealer, activity.DefaultLimits),
		env: map[string]string{"DATABASE_URL": url, "ENCRYPTION_KEY": key, "USER": "tester"}}
}

type result struct {
	code           int
	stdout, stderr string
}

func (c *cli) runStdin(stdin string, args ...string) result {
	c.t.Helper()
	var out, errOut bytes.Buffer
	env := manage.Env{Getenv: func(k string) string { return c.env[k] }, Stdin: strings.NewReader(stdin), Mailer: c.mailer}
	code := manage.Run(c.ctx, args, env, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

func (c *cli) run(args ...string) result {
	c.t.Helper()
	return c.runStdin("", args...)
}

// ok runs a command that must succeed.
func (c *cli) ok(args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("core %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// fails checks a command's exit status and that its stderr contains each of want.
func (c *cli) fails(code int, want []string, args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != code {
		c.t.Errorf("core %s: exit %d, want %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), r.code, code, r.stdout, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			c.t.Errorf("core %s: stderr %q does not contain %q", strings.Join(args, " "), r.stderr, w)
		}
	}
	return r
}

// field returns the value of a "  label: value" line of out.
func field(t *testing.T, out, label string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(label) + `:\s*(\S+)\s*$`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no %q in output:\n%s", label, out)
	}
	return m[1]
}

func (c *cli) audits() []store.AuditEntry {
	c.t.Helper()
	list, err := c.st.AuditLogs(c.ctx, "", 1000)
	if err != nil {
		c.t.Fatal(err)
	}
	return list
}

// noSecretsAnywhere fails if an audit row contains one of the secrets.
func (c *cli) noSecretsAnywhere(secrets ...string) {
	c.t.Helper()
	for _, a := range c.audits() {
		for _, s := range secrets {
			if strings.Contains(string(a.Changes), s) || strings.Contains(a.Resource, s) {
				c.t.Errorf("audit row %s contains a secret: %s", a.Action, a.Changes)
			}
		}
	}
}

func (c *cli) storedLimits(tenantID string) string {
	c.t.Helper()
	var doc string
	if err := c.pool.QueryRow(c.ctx, `SELECT limits::text FROM tenants WHERE id = $1`, tenantID).Scan(&doc); err != nil {
		c.t.Fatal(err)
	}
	return doc
}

func (c *cli) createTenant(name string) (id, key string) {
	c.t.Helper()
	r := c.ok("tenants", "create", "--name", name)
	return field(c.t, r.stdout, "id"), field(c.t, r.stdout, "api key")
}

func TestHelpAndUsage(t *testing.T) {
	t.Parallel()
	c := &cli{t: t, ctx: context.Background(), env: map[string]string{}}
	every := []string{"serve", "migrate", "tenants create", "tenants rotate-key", "tenants deactivate", "tenants activate",
		"tenants origins set", "tenants origins show", "channels create", "channels deactivate", "channels activate",
		"channels update", "users create", "users deactivate", "users activate", "limits set", "limits show",
		"limits clear", "admins create", "help"}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		r := c.run(args...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("%v: exit %d stderr %q", args, r.code, r.stderr)
		}
		for _, cmd := range every {
			if !strings.Contains(r.stdout, cmd) {
				t.Errorf("%v: usage does not list %q", args, cmd)
			}
		}
	}
	r := c.run()
	if r.code != 2 || !strings.Contains(r.stderr, "tenants rotate-key") || r.stdout != "" {
		t.Errorf("no arguments: exit %d, stderr %q", r.code, r.stderr)
	}
	c.fails(2, []string{`unknown command "frobnicate"`, "usage: core"}, "frobnicate")
	c.fails(2, []string{"which command?", "core limits set"}, "limits")
	c.fails(2, []string{`unknown command "rename"`, "core tenants create"}, "tenants", "rename")
	if r := c.run("tenants", "help"); r.code != 0 || !strings.Contains(r.stdout, "core tenants rotate-key --name N [--grace 24h]") {
		t.Errorf("tenants help: %d %q", r.code, r.stdout)
	}
	if r := c.run("help", "limits"); r.code != 0 || !strings.Contains(r.stdout, "core limits clear") || strings.Contains(r.stdout, "tenants") {
		t.Errorf("help limits: %d %q", r.code, r.stdout)
	}
	r = c.run("tenants", "rotate-key", "-h")
	if r.code != 0 || !strings.Contains(r.stdout, "-grace") || !strings.Contains(r.stdout, "-actor") || !strings.Contains(r.stdout, "one slot") {
		t.Errorf("rotate-key -h: %d %q %q", r.code, r.stdout, r.stderr)
	}
	// Command-line errors are found before the database is needed: no DATABASE_URL here.
	c.fails(2, []string{"--name is required", "usage: core tenants create --name N"}, "tenants", "create")
	c.fails(2, []string{"flag provided but not defined: -nmae"}, "tenants", "create", "--nmae", "x")
	c.fails(2, []string{`unexpected argument "extra"`}, "tenants", "create", "--name", "x", "extra")
	c.fails(1, []string{"DATABASE_URL is required"}, "tenants", "create", "--name", "x")
	c.env["DATABASE_URL"] = "postgres://u:s3cretpw@[::1"
	r = c.fails(1, []string{"DATABASE_URL is not a valid"}, "limits", "show", "--tenant", "x")
	if strings.Contains(r.stderr, "s3cretpw") {
		t.Errorf("the database password is printed: %q", r.stderr)
	}
}

func TestTenantsCreate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	r := c.ok("tenants", "create", "--name", "Acme")
	id, key := field(t, r.stdout, "id"), field(t, r.stdout, "api key")
	if !strings.HasPrefix(key, credentials.APIKeyPrefix) || strings.Count(r.stdout, key) != 1 {
		t.Fatalf("the key is printed once, with its prefix:\n%s", r.stdout)
	}
	if !strings.Contains(r.stdout, "shown only this once") || r.stderr != "" {
		t.Fatalf("output:\n%s\nstderr: %s", r.stdout, r.stderr)
	}
	var name, status, prefix string
	var hash []byte
	if err := c.pool.QueryRow(c.ctx, `SELECT name, status, api_key_hash, api_key_prefix FROM tenants WHERE id = $1`, id).
		Scan(&name, &status, &hash, &prefix); err != nil {
		t.Fatal(err)
	}
	if name != "Acme" || status != "active" || !bytes.Equal(hash, credentials.Hash(key)) || prefix != key[:13] {
		t.Fatalf("stored %s %s %x %s", name, status, hash, prefix)
	}
	if ten, err := c.st.TenantByAPIKey(c.ctx, key); err != nil || ten.ID != id {
		t.Fatalf("the printed key does not authenticate: %v", err)
	}
	a := c.audits()
	if len(a) != 1 || a[0].Actor != "cli:tester" || a[0].Action != "tenants.create" || a[0].Resource != "tenant:"+id {
		t.Fatalf("audit %+v", a)
	}

	c.fails(1, []string{`a tenant named "ACME" already exists`}, "tenants", "create", "--name", "ACME")
	c.fails(2, []string{"--name starts or ends with a space"}, "tenants", "create", "--name", " padded")
	r = c.ok("tenants", "create", "--name", "Other Co", "--actor", "ops:bob")
	if a := c.audits(); len(a) != 2 || a[0].Actor != "ops:bob" {
		t.Fatalf("--actor: %+v", a)
	}
	if !strings.Contains(r.stdout, "--name 'Other Co'") {
		t.Errorf("the rotate hint does not quote the name:\n%s", r.stdout)
	}
	c.noSecretsAnywhere(key, key[13:], field(t, r.stdout, "api key"))
}

func TestTenantsRotateKey(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	id, key1 := c.createTenant("acme")
	valid := func(key string) bool {
		ten, err := c.st.TenantByAPIKey(c.ctx, key)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil && ten.ID == id
	}

	r := c.ok("tenants", "rotate-key", "--name", "ACME")
	key2 := field(t, r.stdout, "api key")
	if key2 == key1 || strings.Count(r.stdout, key2) != 1 || !strings.Contains(r.stdout, "keeps working until") ||
		!strings.Contains(r.stdout, "grace 24h0m0s") || !strings.Contains(r.stdout, key1[:13]+"...") {
		t.Fatalf("rotate output:\n%s", r.stdout)
	}
	var expires time.Time
	if err := c.pool.QueryRow(c.ctx, `SELECT previous_api_key_expires_at FROM tenants WHERE id = $1`, id).Scan(&expires); err != nil {
		t.Fatal(err)
	}
	if d := time.Until(expires); d < 23*time.Hour || d > 25*time.Hour {
		t.Fatalf("the default grace ends in %s, want 24h", d)
	}
	if !valid(key1) || !valid(key2) {
		t.Fatal("within the grace the old and the new key work")
	}
	if _, err := c.pool.Exec(c.ctx, `UPDATE tenants SET previous_api_key_expires_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if valid(key1) || !valid(key2) {
		t.Fatal("after the grace only the new key works")
	}

	r = c.ok("tenants", "rotate-key", "--name", "acme", "--grace", "1h")
	key3 := field(t, r.stdout, "api key")
	if strings.Contains(r.stdout, "previous rotation") {
		t.Fatalf("nothing was dropped (the earlier grace had ended):\n%s", r.stdout)
	}
	r = c.ok("tenants", "rotate-key", "--name", "acme", "--grace", "1h")
	key4 := field(t, r.stdout, "api key")
	if !strings.Contains(r.stdout, "The key replaced by the previous rotation was still within its grace and stopped working now.") {
		t.Fatalf("a second rotation within the grace must say that it stopped the earlier key:\n%s", r.stdout)
	}
	if valid(key2) || !valid(key3) || !valid(key4) {
		t.Fatalf("two rotations within the grace: key2 %v key3 %v key4 %v", valid(key2), valid(key3), valid(key4))
	}
	r = c.ok("tenants", "rotate-key", "--name", "acme", "--grace", "0s")
	key5 := field(t, r.stdout, "api key")
	if !strings.Contains(r.stdout, "stopped working now") || valid(key4) || !valid(key5) {
		t.Fatalf("--grace 0s:\n%s", r.stdout)
	}

	c.fails(2, []string{"--grace must be from 0s to 720h0m0s"}, "tenants", "rotate-key", "--name", "acme", "--grace", "-1s")
	c.fails(2, []string{"--grace must be from 0s"}, "tenants", "rotate-key", "--name", "acme", "--grace", "721h")
	c.fails(2, []string{`invalid value "soon" for flag -grace`}, "tenants", "rotate-key", "--name", "acme", "--grace", "soon")
	c.fails(2, []string{"--name is required"}, "tenants", "rotate-key")
	c.fails(1, []string{`no tenant named "nobody"`}, "tenants", "rotate-key", "--name", "nobody")
	if !valid(key5) {
		t.Fatal("a failed rotation changed the key")
	}
	n := 0
	for _, a := range c.audits() {
		if a.Action == "tenants.rotate_key" {
			n++
		}
	}
	if n != 4 {
		t.Fatalf("%d rotation audit rows, want 4", n)
	}
	c.noSecretsAnywhere(key1, key2, key3, key4, key5, key5[13:])
}

func TestTenantsDeactivate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	id, key := c.createTenant("acme")
	r := c.ok("tenants", "deactivate", "--name", "acme")
	if !strings.Contains(r.stdout, "deactivated") {
		t.Fatalf("output %q", r.stdout)
	}
	var status string
	if err := c.pool.QueryRow(c.ctx, `SELECT status FROM tenants WHERE id = $1`, id).Scan(&status); err != nil || status != "inactive" {
		t.Fatalf("status %q %v", status, err)
	}
	if _, err := c.st.TenantByAPIKey(c.ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an inactive tenant's key still works: %v", err)
	}
	r = c.ok("tenants", "deactivate", "--name", "acme")
	if !strings.Contains(r.stdout, "already inactive") {
		t.Fatalf("second deactivate: %q", r.stdout)
	}
	c.fails(1, []string{`no tenant named "nobody"`}, "tenants", "deactivate", "--name", "nobody")
	if a := c.audits(); len(a) != 2 || a[0].Action != "tenants.deactivate" {
		t.Fatalf("audit %+v", a)
	}
}

func TestChannelsCreate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenantID, _ := c.createTenant("acme")
	r := c.ok("channels", "create", "--tenant", "acme", "--name", "web", "--type", "echo")
	id, secret, pk := field(t, r.stdout, "id"), field(t, r.stdout, "secret"), field(t, r.stdout, "publishable key")
	if strings.Count(r.stdout, secret) != 1 || strings.Count(r.stdout, pk) != 1 || !strings.HasPrefix(pk, credentials.PublishablePrefix) ||
		!strings.Contains(r.stdout, "shown only this once") {
		t.Fatalf("output:\n%s", r.stdout)
	}
	ch, err := c.st.ChannelBySecret(c.ctx, secret)
	if err != nil || ch.ID != id || ch.TenantID != tenantID || ch.Type != "echo" || ch.Mode != "duplex" {
		t.Fatalf("ChannelBySecret(printed secret): %+v %v", ch, err)
	}
	if ch, err := c.st.ChannelByPublishableKey(c.ctx, pk); err != nil || ch.ID != id {
		t.Fatalf("ChannelByPublishableKey(printed key): %v", err)
	}
	// Sealed with the ENCRYPTION_KEY the command was given.
	if _, got, err := c.st.InboundChannel(c.ctx, id); err != nil || string(got) != secret {
		t.Fatalf("InboundChannel: %v", err)
	}
	var secretHash, pkHash, sealed []byte
	if err := c.pool.QueryRow(c.ctx, `SELECT secret_hash, publishable_key_hash, secret_ciphertext FROM channels WHERE id = $1`, id).
		Scan(&secretHash, &pkHash, &sealed); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(secretHash, credentials.Hash(secret)) || !bytes.Equal(pkHash, credentials.Hash(pk)) || bytes.Contains(sealed, []byte(secret)) {
		t.Fatal("the stored channel credentials are not the printed ones' hashes and seal")
	}

	r = c.ok("channels", "create", "--tenant", "ACME", "--name", "hook", "--type", "webhook", "--mode", "inbound")
	if ch, err := c.st.ChannelByID(c.ctx, field(t, r.stdout, "id")); err != nil || ch.Mode != "inbound" || ch.Type != "webhook" {
		t.Fatalf("webhook channel %+v %v", ch, err)
	}

	c.fails(2, []string{`--type "sms": must be one of echo, webhook`}, "channels", "create", "--tenant", "acme", "--name", "x", "--type", "sms")
	c.fails(2, []string{`--mode "both": must be one of inbound, outbound, duplex`}, "channels", "create", "--tenant", "acme", "--name", "x", "--type", "echo", "--mode", "both")
	c.fails(2, []string{"--tenant is required"}, "channels", "create", "--name", "x", "--type", "echo")
	c.fails(2, []string{"--name is required"}, "channels", "create", "--tenant", "acme", "--type", "echo")
	c.fails(2, []string{"--type is required"}, "channels", "create", "--tenant", "acme", "--name", "x")
	c.fails(1, []string{`no tenant named "nobody"`}, "channels", "create", "--tenant", "nobody", "--name", "x", "--type", "echo")
	c.fails(1, []string{`tenant acme already has a channel named "web"`}, "channels", "create", "--tenant", "acme", "--name", "web", "--type", "echo")
	c.env["ENCRYPTION_KEY"] = ""
	c.fails(1, []string{"ENCRYPTION_KEY is required"}, "channels", "create", "--tenant", "acme", "--name", "x", "--type", "echo")
	c.env["ENCRYPTION_KEY"] = "short"
	c.fails(1, []string{"ENCRYPTION_KEY: "}, "channels", "create", "--tenant", "acme", "--name", "x", "--type", "echo")

	var n int
	if err := c.pool.QueryRow(c.ctx, `SELECT count(*) FROM channels`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d channels, want 2", n)
	}
	if a := c.audits(); len(a) != 3 || a[1].Action != "channels.create" || a[1].Resource != "channel:"+id {
		t.Fatalf("audit %+v", a)
	}
	c.noSecretsAnywhere(secret, pk)
}

func listen(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	if _, err := conn.Exec(ctx, "LISTEN rate_limit_overrides"); err != nil {
		t.Fatal(err)
	}
	return conn
}

// notification waits up to d for a notification.
func notification(conn *pgx.Conn, d time.Duration) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	n, err := conn.WaitForNotification(ctx)
	if err != nil {
		return "", false
	}
	return n.Payload, true
}

func TestLimits(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	id, _ := c.createTenant("acme")
	otherID, _ := c.createTenant("other")
	conn := listen(t, c.url)

	r := c.ok("limits", "set", "--tenant", "acme", "inbound=2000/1s", "activity_create=300/1s")
	if !strings.Contains(r.stdout, "inbound            2000/1s    (was: no override)") || !strings.Contains(r.stdout, "NOTIFY rate_limit_overrides") {
		t.Fatalf("set output:\n%s", r.stdout)
	}
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("notification %q %v, want %s", p, ok, id)
	}
	if got := c.storedLimits(id); got != `{"inbound": {"limit": 2000, "scale_ms": 1000}, "activity_create": {"limit": 300, "scale_ms": 1000}}` {
		t.Fatalf("stored %s", got)
	}
	// Merged with what is set; flags may follow the limits.
	c.ok("limits", "set", "token_generate=20/1m", "upload=5/500ms", "--tenant", "acme", "--actor", "ops:carol")
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("second notification %q %v", p, ok)
	}
	o, err := buckets.ParseOverrides([]byte(c.storedLimits(id)))
	if err != nil || len(o) != 4 || o[buckets.TokenGenerate] != (buckets.Limit{Count: 20, Window: time.Minute}) ||
		o[buckets.Upload] != (buckets.Limit{Count: 5, Window: 500 * time.Millisecond}) || o[buckets.Inbound].Count != 2000 {
		t.Fatalf("merged overrides %v %v", o, err)
	}
	if got := c.storedLimits(otherID); got != `{}` {
		t.Fatalf("the other tenant's limits: %s", got)
	}

	r = c.ok("limits", "show", "--tenant", "acme")
	for _, want := range []string{
		"activity_create    300/1s     tenant override",
		"upload             5/500ms    tenant override",
		"token_generate     20/1m      tenant override",
		"publishable_token  300/1m     built-in default",
		`stored: {"upload": {"limit": 5, "scale_ms": 500}, "inbound": {"limit": 2000, "scale_ms": 1000}, "token_generate": {"limit": 20, "scale_ms": 60000}, "activity_create"`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, r.stdout)
		}
	}

	// Setting the same value again changes, announces and audits nothing.
	r = c.ok("limits", "set", "--tenant", "acme", "inbound=2000/1000ms")
	if !strings.Contains(r.stdout, "unchanged") {
		t.Fatalf("same value: %s", r.stdout)
	}

	before := c.storedLimits(id)
	auditsBefore := len(c.audits())
	for _, tc := range []struct {
		want []string
		args []string
	}{
		{[]string{`"nope" is not an overridable bucket (allowed: activity_create, upload, inbound, token_generate, publishable_token)`}, []string{"nope=1/1s"}},
		{[]string{`"login_ip" is not an overridable bucket`}, []string{"login_ip=5/1m"}},
		{[]string{`the limit "0" must be a positive integer`}, []string{"inbound=0/1s"}},
		{[]string{`the limit "-5" must be a positive integer`}, []string{"inbound=-5/1s"}},
		{[]string{`the limit "1.5" must be a positive integer`}, []string{"inbound=1.5/1s"}},
		{[]string{`the limit "4294967296" must be a positive integer up to 4294967295`}, []string{"inbound=4294967296/1s"}},
		{[]string{`the window "1x" is not a duration such as 500ms, 1s, 60s or 1h`}, []string{"inbound=10/1x"}},
		{[]string{`the window must be a positive whole number of milliseconds`}, []string{"inbound=10/1500us"}},
		{[]string{`the window must be a positive whole number of milliseconds`}, []string{"inbound=10/0s"}},
		{[]string{`the window must be at most 24h0m0s`}, []string{"inbound=10/25h"}},
		{[]string{`write BUCKET=LIMIT/WINDOW, e.g. inbound=2000/1s`}, []string{"inbound"}},
		{[]string{`write BUCKET=LIMIT/WINDOW`}, []string{"inbound=10"}},
		{[]string{"inbound is given twice"}, []string{"inbound=10/1s", "inbound=20/1s"}},
		{[]string{"name at least one limit"}, nil},
	} {
		c.fails(2, tc.want, append([]string{"limits", "set", "--tenant", "acme"}, tc.args...)...)
	}
	c.fails(2, []string{"--tenant is required"}, "limits", "set", "inbound=10/1s")
	c.fails(1, []string{`no tenant named "nobody"`}, "limits", "set", "--tenant", "nobody", "inbound=10/1s")
	c.fails(2, []string{`"login_ip" is not an overridable bucket`}, "limits", "clear", "--tenant", "acme", "login_ip")
	c.fails(1, []string{`no tenant named "nobody"`}, "limits", "show", "--tenant", "nobody")
	c.fails(1, []string{`no tenant named "nobody"`}, "limits", "clear", "--tenant", "nobody")
	c.fails(2, []string{"--tenant is required"}, "limits", "show")
	if p, ok := notification(conn, 300*time.Millisecond); ok {
		t.Fatalf("notification %q from a refused or unchanged command", p)
	}
	if got := c.storedLimits(id); got != before || len(c.audits()) != auditsBefore {
		t.Fatalf("refused commands changed something: %s, %d audit rows (was %d)", got, len(c.audits()), auditsBefore)
	}

	r = c.ok("limits", "clear", "--tenant", "acme", "inbound", "upload")
	if !strings.Contains(r.stdout, "inbound            (was: 2000/1s)") {
		t.Fatalf("clear output:\n%s", r.stdout)
	}
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("clear notification %q %v", p, ok)
	}
	if got := c.storedLimits(id); got != `{"token_generate": {"limit": 20, "scale_ms": 60000}, "activity_create": {"limit": 300, "scale_ms": 1000}}` {
		t.Fatalf("after clearing two: %s", got)
	}
	c.ok("limits", "clear", "--tenant", "acme")
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("clear-all notification %q %v", p, ok)
	}
	if got := c.storedLimits(id); got != `{}` {
		t.Fatalf("after clearing all: %s", got)
	}
	r = c.ok("limits", "clear", "--tenant", "acme")
	if !strings.Contains(r.stdout, "unchanged") {
		t.Fatalf("clearing nothing: %s", r.stdout)
	}

	var actions []string
	for _, a := range c.audits() {
		if a.Resource == "tenant:"+id && strings.HasPrefix(a.Action, "limits.") {
			actions = append(actions, a.Action+" by "+a.Actor)
		}
	}
	if got := strings.Join(actions, ", "); got != "limits.clear by cli:tester, limits.clear by cli:tester, limits.set by ops:carol, limits.set by cli:tester" {
		t.Fatalf("limit audit rows (newest first): %s", got)
	}
	var changes struct{ Before, After json.RawMessage }
	for _, a := range c.audits() {
		if a.Action == "limits.set" && a.Actor == "ops:carol" {
			if err := json.Unmarshal(a.Changes, &changes); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !strings.Contains(string(changes.Before), `"inbound"`) || strings.Contains(string(changes.Before), "token_generate") ||
		!strings.Contains(string(changes.After), `"token_generate": {"limit": 20, "scale_ms": 60000}`) {
		t.Fatalf("limits.set changes: before %s after %s", changes.Before, changes.After)
	}
}

// TestLimitsReachTheSidecar: the sidecar's own directory, with a cache that would keep
// the old overrides for an hour, sees the new ones as soon as the command commits.
func TestLimitsReachTheSidecar(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	id, _ := c.createTenant("acme")
	dir := sidecartenants.New(c.pool, sidecartenants.Options{OverrideTTL: time.Hour, Wait: 5 * time.Second})
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	go dir.Listen(ctx)
	deadline := time.Now().Add(10 * time.Second)
	for !dir.Listening() {
		if time.Now().After(deadline) {
			t.Fatal("the sidecar directory does not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if o, st := dir.Overrides(id); st != sidecartenants.Found || len(o) != 0 {
		t.Fatalf("before: %v %v", o, st)
	}
	c.ok("limits", "set", "--tenant", "acme", "inbound=2000/1s")
	want := buckets.Limit{Count: 2000, Window: time.Second}
	deadline = time.Now().Add(5 * time.Second)
	for {
		o, _ := dir.Overrides(id)
		if o[buckets.Inbound] == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sidecar still has %v", o)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestAdminsCreate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	r := c.ok("admins", "create", "--email", "ops@example.com")
	id, password := field(t, r.stdout, "id"), field(t, r.stdout, "password")
	if len(password) < 20 || strings.Count(r.stdout, password) != 1 || !strings.Contains(r.stdout, "must be changed at the first login") {
		t.Fatalf("output:\n%s", r.stdout)
	}
	var hash string
	var must bool
	if err := c.pool.QueryRow(c.ctx, `SELECT password_hash, must_change_password FROM admin_users WHERE id = $1`, id).Scan(&hash, &must); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(hash, "$argon2id$v=19$m=19456,t=2,p=1$") || !must {
		t.Fatalf("stored %q must_change %v", hash, must)
	}
	if ok, err := passwords.Verify(password, hash); !ok || err != nil {
		t.Fatalf("the printed password does not verify: %v %v", ok, err)
	}

	const chosen = "a sufficiently long passphrase"
	r = c.runStdin(chosen+"\n", "admins", "create", "--email", "second@example.com", "--password-stdin")
	if r.code != 0 || strings.Contains(r.stdout, chosen) {
		t.Fatalf("--password-stdin: %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	if err := c.pool.QueryRow(c.ctx, `SELECT password_hash, must_change_password FROM admin_users WHERE id = $1`,
		field(t, r.stdout, "id")).Scan(&hash, &must); err != nil {
		t.Fatal(err)
	}
	if ok, _ := passwords.Verify(chosen, hash); !ok || must {
		t.Fatalf("chosen password: verifies %v, must_change %v", ok, must)
	}

	for _, tc := range []struct{ stdin, want string }{
		{"short\n", "at least 12 characters"},
		{"", "at least 12 characters"},
		{"first line is long\nsecond line\n", "on one line"},
		{strings.Repeat("x", passwords.MaxLength+1), "longer than 1024 bytes"},
	} {
		r := c.runStdin(tc.stdin, "admins", "create", "--email", "third@example.com", "--password-stdin")
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("stdin %.20q: exit %d, stderr %q", tc.stdin, r.code, r.stderr)
		}
	}
	c.fails(1, []string{"an admin user with email OPS@example.com already exists"}, "admins", "create", "--email", "OPS@example.com")
	c.fails(2, []string{`--email: "not-an-email" is not an email address`}, "admins", "create", "--email", "not-an-email")
	c.fails(2, []string{"--email is required"}, "admins", "create")

	var n int
	if err := c.pool.QueryRow(c.ctx, `SELECT count(*) FROM admin_users`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d admins, want 2", n)
	}
	a := c.audits()
	if len(a) != 2 || a[1].Action != "admins.create" || a[1].Resource != "admin_user:"+id ||
		!strings.Contains(string(a[1].Changes), `"must_change_password": true`) {
		t.Fatalf("audit %+v", a)
	}
	c.noSecretsAnywhere(password, chosen, "$argon2id$")
}

// TestUnmigratedDatabase: a database without the schema says to migrate.
func TestUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.env["DATABASE_URL"] = pgserver.NewTestDatabase(t, nil)
	c.fails(1, []string{"run `core migrate` first"}, "tenants", "create", "--name", "acme")
	c.env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:1/none?connect_timeout=2"
	c.fails(1, []string{"cannot reach the database at DATABASE_URL"}, "limits", "show", "--tenant", "acme")
}
