package manage_test

import (
	"strings"
	"testing"
)

func TestAdminTokens(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	c.ok("admins", "create", "--email", "ops@example.com")
	r := c.ok("admins", "token", "create", "--email", "OPS@example.com", "--scope", "read", "--name", "grafana", "--expires-in", "90d", "--actor", "cli:bob")
	id, tok := field(t, r.stdout, "id"), field(t, r.stdout, "token")
	if !strings.HasPrefix(tok, "cvg_admin_") || strings.Count(r.stdout, tok) != 1 || !strings.Contains(r.stdout, "shown only this once") ||
		field(t, r.stdout, "scope") != "read" {
		t.Fatalf("output:\n%s", r.stdout)
	}
	a, err := c.st.AdminByToken(c.ctx, tok)
	if err != nil || a.Scope != "read" || a.Email != "ops@example.com" {
		t.Fatalf("the printed token does not work: %+v, %v", a, err)
	}
	list := c.ok("admins", "token", "list", "--email", "ops@example.com").stdout
	if !strings.Contains(list, id) || !strings.Contains(list, "grafana") || !strings.Contains(list, "expires ") || strings.Contains(list, tok) {
		t.Fatalf("list:\n%s", list)
	}
	r = c.ok("admins", "token", "revoke", "--id", id)
	if !strings.Contains(r.stdout, "revoked; it stops working now") {
		t.Fatalf("revoke: %s", r.stdout)
	}
	if _, err := c.st.AdminByToken(c.ctx, tok); err == nil {
		t.Fatal("a revoked token works")
	}
	if r := c.ok("admins", "token", "revoke", "--id", id); !strings.Contains(r.stdout, "revoked already") {
		t.Fatalf("revoke twice: %s", r.stdout)
	}
	if !strings.Contains(c.ok("admins", "token", "list", "--email", "ops@example.com").stdout, "revoked ") {
		t.Fatal("the list does not say the token is revoked")
	}

	c.fails(2, []string{"--scope is required"}, "admins", "token", "create", "--email", "ops@example.com")
	c.fails(2, []string{`--scope "admin": must be read or write`}, "admins", "token", "create", "--email", "ops@example.com", "--scope", "admin")
	c.fails(2, []string{"--expires-in"}, "admins", "token", "create", "--email", "ops@example.com", "--scope", "read", "--expires-in", "soon")
	c.fails(2, []string{"at most 366d"}, "admins", "token", "create", "--email", "ops@example.com", "--scope", "read", "--expires-in", "400d")
	c.fails(1, []string{"no admin with email nobody@example.com"}, "admins", "token", "create", "--email", "nobody@example.com", "--scope", "write")
	c.fails(2, []string{"a token id is a UUID"}, "admins", "token", "revoke", "--id", "nope")
	c.fails(1, []string{"no admin token with id"}, "admins", "token", "revoke", "--id", "00000000-0000-4000-8000-000000000000")

	var actions []string
	for _, e := range c.audits() {
		if strings.HasPrefix(e.Action, "admins.token") {
			actions = append(actions, e.Actor+" "+e.Action)
		}
	}
	if got := strings.Join(actions, ","); got != "cli:tester admins.token_revoke,cli:bob admins.token_create" {
		t.Fatalf("audit: %s", got)
	}
	c.noSecretsAnywhere(tok, tok[len("cvg_admin_"):])
}
