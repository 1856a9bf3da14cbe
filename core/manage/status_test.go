package manage_test

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
)

// listenTenantChanges is a connection that LISTENs on tenant_changes.
func listenTenantChanges(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn := listen(t, url)
	if _, err := conn.Exec(context.Background(), "UNLISTEN *; LISTEN "+store.NotifyTenantChanges); err != nil {
		t.Fatal(err)
	}
	return conn
}

func (c *cli) lastAudit() store.AuditEntry {
	c.t.Helper()
	a := c.audits()
	if len(a) == 0 {
		c.t.Fatal("no audit rows")
	}
	return a[0]
}

func TestTenantsActivate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	id, key := c.createTenant("acme")
	conn := listenTenantChanges(t, c.url)
	r := c.ok("tenants", "deactivate", "--name", "ACME")
	if !strings.Contains(r.stdout, "deactivated") || !strings.Contains(r.stdout, "by the sidecars too") {
		t.Fatalf("deactivate: %q", r.stdout)
	}
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("deactivation announced as %q %v", p, ok)
	}
	r = c.ok("tenants", "activate", "--name", "acme", "--actor", "ops:carol")
	if !strings.Contains(r.stdout, "activated") {
		t.Fatalf("activate: %q", r.stdout)
	}
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("activation announced as %q %v", p, ok)
	}
	if ten, err := c.st.TenantByAPIKey(c.ctx, key); err != nil || ten.ID != id {
		t.Fatalf("the key of the tenant active again: %v", err)
	}
	if a := c.lastAudit(); a.Action != "tenants.activate" || a.Actor != "ops:carol" || a.Resource != "tenant:"+id {
		t.Fatalf("audit %+v", a)
	}
	if r := c.ok("tenants", "activate", "--name", "acme"); !strings.Contains(r.stdout, "already active") {
		t.Fatalf("activate twice: %q", r.stdout)
	}
	c.fails(1, []string{`no tenant named "nobody"`}, "tenants", "activate", "--name", "nobody")
	c.fails(2, []string{"--name is required"}, "tenants", "activate")
}

func TestChannelsStatusAndUpdate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenantID, _ := c.createTenant("acme")
	r := c.ok("channels", "create", "--tenant", "acme", "--name", "whatsapp", "--type", "webhook")
	id, secret := field(t, r.stdout, "id"), field(t, r.stdout, "secret")
	conn := listenTenantChanges(t, c.url)
	channel := func() store.Channel {
		ch, err := c.st.ChannelByID(c.ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return ch
	}

	r = c.ok("channels", "deactivate", "--tenant", "ACME", "--name", "whatsapp")
	if !strings.Contains(r.stdout, "deactivated") || channel().Active() {
		t.Fatalf("deactivate: %q %+v", r.stdout, channel())
	}
	if p, ok := notification(conn, 5*time.Second); !ok || p != tenantID {
		t.Fatalf("announced as %q %v, want the tenant %s", p, ok, tenantID)
	}
	if ch, err := c.st.ChannelBySecret(c.ctx, secret); err != nil || ch.Active() {
		t.Fatalf("the secret of an inactive channel: %+v %v", ch, err)
	}
	if r := c.ok("channels", "deactivate", "--tenant", "acme", "--name", "whatsapp"); !strings.Contains(r.stdout, "already inactive") {
		t.Fatalf("twice: %q", r.stdout)
	}
	c.ok("channels", "activate", "--tenant", "acme", "--name", "whatsapp")
	if !channel().Active() {
		t.Fatal("not active again")
	}

	r = c.ok("channels", "update", "--tenant", "acme", "--name", "whatsapp", "--require-signature=false")
	if !strings.Contains(r.stdout, "unsigned inbound webhooks are accepted") || channel().RequireSignature {
		t.Fatalf("update: %q %+v", r.stdout, channel())
	}
	if a := c.lastAudit(); a.Action != "channels.update" || a.Resource != "channel:"+id ||
		!strings.Contains(string(a.Changes), `"after": {"require_signature": false}`) {
		t.Fatalf("audit %+v", a)
	}
	if r := c.ok("channels", "update", "--tenant", "acme", "--name", "whatsapp", "--require-signature", "false"); !strings.Contains(r.stdout, "nothing changed") {
		t.Fatalf("update twice: %q", r.stdout)
	}
	c.ok("channels", "update", "--tenant", "acme", "--name", "whatsapp", "--require-signature=true")
	if !channel().RequireSignature {
		t.Fatal("require_signature not back on")
	}
	actions := []string{}
	for _, a := range c.audits() {
		if a.Resource == "channel:"+id {
			actions = append(actions, a.Action)
		}
	}
	if want := []string{"channels.update", "channels.update", "channels.activate", "channels.deactivate", "channels.create"}; !slices.Equal(actions, want) {
		t.Fatalf("audit actions %q, want %q", actions, want)
	}

	c.fails(2, []string{"nothing to update", "--require-signature=true"}, "channels", "update", "--tenant", "acme", "--name", "whatsapp")
	c.fails(2, []string{"must be true or false"}, "channels", "update", "--tenant", "acme", "--name", "whatsapp", "--require-signature=maybe")
	c.fails(2, []string{"--name is required"}, "channels", "deactivate", "--tenant", "acme")
	c.fails(1, []string{`tenant acme has no channel named "sms"`}, "channels", "activate", "--tenant", "acme", "--name", "sms")
	c.fails(1, []string{`no tenant named "nobody"`}, "channels", "deactivate", "--tenant", "nobody", "--name", "whatsapp")
}

func TestTenantsOrigins(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	id, _ := c.createTenant("acme")
	if r := c.ok("tenants", "origins", "show", "--name", "acme"); !strings.Contains(r.stdout, "(none") {
		t.Fatalf("show before: %q", r.stdout)
	}
	conn := listenTenantChanges(t, c.url)
	r := c.ok("tenants", "origins", "set", "--name", "acme", "https://Shop.Example.com/", "http://localhost:3000")
	if !strings.Contains(r.stdout, "  http://localhost:3000\n  https://shop.example.com\n") {
		t.Fatalf("set: %q", r.stdout)
	}
	if p, ok := notification(conn, 5*time.Second); !ok || p != id {
		t.Fatalf("announced as %q %v", p, ok)
	}
	if got, err := c.st.TenantOrigins(c.ctx, id); err != nil || !slices.Equal(got, []string{"http://localhost:3000", "https://shop.example.com"}) {
		t.Fatalf("stored %q %v", got, err)
	}
	if r := c.ok("tenants", "origins", "show", "--name", "ACME"); !strings.Contains(r.stdout, "  https://shop.example.com\n") {
		t.Fatalf("show: %q", r.stdout)
	}
	if a := c.lastAudit(); a.Action != "tenants.origins_set" || a.Actor != "cli:tester" ||
		string(a.Changes) != `{"after": ["http://localhost:3000", "https://shop.example.com"], "before": []}` {
		t.Fatalf("audit %+v", a)
	}
	if r := c.ok("tenants", "origins", "set", "--name", "acme", "http://localhost:3000", "https://shop.example.com:443"); !strings.Contains(r.stdout, "nothing changed") {
		t.Fatalf("the same again: %q", r.stdout)
	}
	c.fails(2, []string{`"https://shop.example.com/cart" is not an origin`}, "tenants", "origins", "set", "--name", "acme", "https://shop.example.com/cart")
	c.fails(2, []string{"which origins?"}, "tenants", "origins", "set", "--name", "acme")
	c.fails(2, []string{"--none removes every origin"}, "tenants", "origins", "set", "--name", "acme", "--none", "https://x.example")
	c.fails(2, []string{"which command? (set, show)"}, "tenants", "origins")
	c.fails(2, []string{`unknown command "origins"`}, "tenants", "origins", "list", "--name", "acme")
	c.fails(1, []string{`no tenant named "nobody"`}, "tenants", "origins", "show", "--name", "nobody")
	c.ok("tenants", "origins", "set", "--name", "acme", "--none")
	if got, _ := c.st.TenantOrigins(c.ctx, id); len(got) != 0 {
		t.Fatalf("after --none: %q", got)
	}
	if r := c.run("tenants", "origins", "set", "-h"); r.code != 0 || !strings.Contains(r.stdout, "scheme://host[:port]") {
		t.Fatalf("-h: %d %q", r.code, r.stdout)
	}
}

// mailbox records the emails of `users create --send-reset`.
type mailbox struct {
	mu   sync.Mutex
	msgs []mail.Message
	err  error
}

func (m *mailbox) Send(_ context.Context, msg mail.Message) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	m.msgs = append(m.msgs, msg)
	return nil
}

var resetLink = regexp.MustCompile(`https://converger\.example\.com/portal/password/reset/([A-Za-z0-9_-]{43})`)

func TestUsersCreate(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	tenantID, _ := c.createTenant("Initech")

	// A one-time password, to change at the first sign-in.
	r := c.ok("users", "create", "--tenant", "initech", "--email", "peter@example.com")
	id, password := field(t, r.stdout, "id"), field(t, r.stdout, "password")
	u, err := c.st.TenantUserForLogin(c.ctx, "Initech", "peter@example.com")
	if err != nil || u.ID != id || u.TenantID != tenantID || !u.Active || !u.MustChangePassword {
		t.Fatalf("stored %+v %v", u, err)
	}
	if ok, _ := passwords.Verify(password, u.PasswordHash); !ok || strings.Count(r.stdout, password) != 1 {
		t.Fatalf("the printed password does not verify:\n%s", r.stdout)
	}
	if a := c.lastAudit(); a.Action != "tenant_users.create" || a.Resource != "tenant_user:"+id {
		t.Fatalf("audit %+v", a)
	}
	c.fails(1, []string{"tenant Initech already has a portal user with email PETER@example.com"}, "users", "create", "--tenant", "initech", "--email", "PETER@example.com")
	c.fails(2, []string{`--email: "nope" is not an email address`}, "users", "create", "--tenant", "initech", "--email", "nope")
	c.fails(1, []string{`no tenant named "nobody"`}, "users", "create", "--tenant", "nobody", "--email", "x@example.com")
	c.noSecretsAnywhere(password)

	// --send-reset: no password shown; a working link is emailed.
	c.fails(1, []string{"--send-reset needs PUBLIC_URL"}, "users", "create", "--tenant", "initech", "--email", "samir@example.com", "--send-reset")
	c.env["PUBLIC_URL"] = "https://converger.example.com/"
	c.fails(1, []string{"--send-reset needs SMTP_URL"}, "users", "create", "--tenant", "initech", "--email", "samir@example.com", "--send-reset")
	c.env["SMTP_URL"] = "ftp://mail"
	c.fails(1, []string{"SMTP_URL: "}, "users", "create", "--tenant", "initech", "--email", "samir@example.com", "--send-reset")
	if _, err := c.st.TenantUserForLogin(c.ctx, "Initech", "samir@example.com"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused --send-reset created the user: %v", err)
	}
	box := &mailbox{}
	c.mailer = box
	r = c.ok("users", "create", "--tenant", "initech", "--email", "samir@example.com", "--send-reset")
	if strings.Contains(r.stdout, "password:") || !strings.Contains(r.stdout, "emailed to samir@example.com") {
		t.Fatalf("--send-reset output:\n%s", r.stdout)
	}
	if len(box.msgs) != 1 || box.msgs[0].To != "samir@example.com" || !strings.Contains(box.msgs[0].Body, "of tenant Initech was created") {
		t.Fatalf("emails %+v", box.msgs)
	}
	m := resetLink.FindStringSubmatch(box.msgs[0].Body)
	if m == nil {
		t.Fatalf("no link in %q", box.msgs[0].Body)
	}
	if lu, err := c.st.PasswordResetUser(c.ctx, credentials.Hash(m[1]), store.KindTenant, time.Now()); err != nil || lu.Email != "samir@example.com" {
		t.Fatalf("the emailed link: %+v %v", lu, err)
	}
	if a := c.lastAudit(); a.Action != "tenant_users.invite" {
		t.Fatalf("audit %+v", a)
	}
	c.noSecretsAnywhere(m[1])
	// A failed email: the user exists, the command fails and says what to do.
	box.err = errors.New("554 refused")
	c.fails(1, []string{"the user was created, but the link could not be sent: 554 refused", "Forgot your password?"},
		"users", "create", "--tenant", "initech", "--email", "milton@example.com", "--send-reset")
}

func TestUsersStatus(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.createTenant("initech")
	id := field(t, c.ok("users", "create", "--tenant", "initech", "--email", "peter@example.com").stdout, "id")
	if _, err := c.pool.Exec(c.ctx, `INSERT INTO sessions (id_hash, user_kind, user_id, expires_at)
		VALUES ($1, 'tenant', $2, now() + interval '1 hour')`, credentials.Hash("a session"), id); err != nil {
		t.Fatal(err)
	}
	r := c.ok("users", "deactivate", "--tenant", "Initech", "--email", "Peter@Example.com")
	if !strings.Contains(r.stdout, "deactivated") {
		t.Fatalf("deactivate: %q", r.stdout)
	}
	var sessions int
	if err := c.pool.QueryRow(c.ctx, `SELECT count(*) FROM sessions WHERE user_id = $1`, id).Scan(&sessions); err != nil || sessions != 0 {
		t.Fatalf("%d sessions left (%v)", sessions, err)
	}
	if u, _ := c.st.TenantUserForLogin(c.ctx, "initech", "peter@example.com"); u.Active {
		t.Fatal("still active")
	}
	if a := c.lastAudit(); a.Action != "tenant_users.deactivate" || a.Resource != "tenant_user:"+id {
		t.Fatalf("audit %+v", a)
	}
	if r := c.ok("users", "deactivate", "--tenant", "initech", "--email", "peter@example.com"); !strings.Contains(r.stdout, "already inactive") {
		t.Fatalf("twice: %q", r.stdout)
	}
	c.ok("users", "activate", "--tenant", "initech", "--email", "peter@example.com")
	if u, _ := c.st.TenantUserForLogin(c.ctx, "initech", "peter@example.com"); !u.Active {
		t.Fatal("not active again")
	}
	c.fails(1, []string{"tenant initech has no portal user with email bob@example.com"}, "users", "activate", "--tenant", "initech", "--email", "bob@example.com")
	c.fails(2, []string{"--email is required"}, "users", "deactivate", "--tenant", "initech")
}
