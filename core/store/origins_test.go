package store_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/converger/edge/core/store"
)

func TestCanonicalOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"https://www.example.com":       "https://www.example.com",
		"https://WWW.Example.COM/":      "https://www.example.com",
		"HTTPS://shop.example.com:443":  "https://shop.example.com",
		"http://localhost:80":           "http://localhost",
		"http://127.0.0.1:3000":         "http://127.0.0.1:3000",
		"https://example.com:8443":      "https://example.com:8443",
		"http://[::1]:8080":             "http://[::1]:8080",
		"http://[2001:DB8::1]":          "http://[2001:db8::1]",
		"https://xn--bcher-kva.example": "https://xn--bcher-kva.example",
	} {
		got, err := store.CanonicalOrigin(in)
		if err != nil || got != want {
			t.Errorf("CanonicalOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", "null", "*", "example.com", "ftp://example.com", "https://", "https://example.com/path", "https://example.com?x",
		"https://example.com?", "https://example.com#f", "https://user@example.com", "https://*.example.com", "https://example.com:",
		"https://example.com:0", "https://example.com:65536", "https://example.com:08080", "https://bücher.example",
		"https://exa mple.com", " https://example.com", "https://example.com\n", "http://[::1", "http://[zz::1]",
		"https://" + strings.Repeat("a", 300) + ".com", "https://ex%41mple.com", "javascript:alert(1)", "https:example.com",
	} {
		if got, err := store.CanonicalOrigin(in); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("CanonicalOrigin(%q) = %q, %v; want ErrInvalid", in, got, err)
		}
	}
}

// A tenant's origins are set (canonical, deduplicated, sorted), shown, audited and
// announced; an unchanged list writes nothing; only active tenants' origins count.
func TestOperatorTenantOrigins(t *testing.T) {
	t.Parallel()
	e := newManageEnv(t)
	ten, _ := e.tenant("acme")
	other, _ := e.tenant("globex")
	if got, err := e.st.TenantOrigins(e.ctx, ten.ID); err != nil || len(got) != 0 {
		t.Fatalf("a new tenant's origins: %q %v", got, err)
	}
	conn := e.listenTenantChanges()
	ch, err := e.op.SetTenantOrigins(e.ctx, ten.ID, []string{"https://Shop.Example.com/", "http://localhost:3000", "https://shop.example.com:443"})
	want := []string{"http://localhost:3000", "https://shop.example.com"}
	if err != nil || !ch.Changed || !slices.Equal(ch.After, want) || len(ch.Before) != 0 || ch.Tenant.Name != "acme" {
		t.Fatalf("set: %+v %v", ch, err)
	}
	e.expectNotified(conn, "origins set", ten.ID)
	if got, err := e.st.TenantOrigins(e.ctx, ten.ID); err != nil || !slices.Equal(got, want) {
		t.Fatalf("stored: %q %v", got, err)
	}
	if ch, err := e.op.SetTenantOrigins(e.ctx, ten.ID, []string{"https://shop.example.com", "http://localhost:3000"}); err != nil || ch.Changed {
		t.Fatalf("the same again: %+v %v", ch, err)
	}
	e.expectQuiet(conn, "the same again")
	if _, err := e.op.SetTenantOrigins(e.ctx, other.ID, []string{"https://globex.example", "https://shop.example.com"}); err != nil {
		t.Fatal(err)
	}
	all, err := e.st.ActiveTenantOrigins(e.ctx)
	slices.Sort(all)
	if err != nil || !slices.Equal(all, []string{"http://localhost:3000", "https://globex.example", "https://shop.example.com"}) {
		t.Fatalf("active origins: %q %v", all, err)
	}
	if _, _, err := e.op.DeactivateTenant(e.ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if all, err = e.st.ActiveTenantOrigins(e.ctx); err != nil || len(all) != 2 {
		t.Fatalf("active origins without the inactive tenant: %q %v", all, err)
	}
	// Invalid lists change nothing.
	for _, list := range [][]string{{"https://ok.example", "nope"}, {"*"}, {"null"}} {
		if _, err := e.op.SetTenantOrigins(e.ctx, ten.ID, list); !errors.Is(err, store.ErrInvalid) {
			t.Fatalf("%q: %v", list, err)
		}
	}
	many := make([]string, store.MaxTenantOrigins+1)
	for i := range many {
		many[i] = fmt.Sprintf("https://site%d.example", i)
	}
	if _, err := e.op.SetTenantOrigins(e.ctx, ten.ID, many); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("%d origins: %v", len(many), err)
	}
	if _, err := e.op.SetTenantOrigins(e.ctx, ten.ID, many[:store.MaxTenantOrigins]); err != nil {
		t.Fatalf("%d origins: %v", store.MaxTenantOrigins, err)
	}
	if _, err := e.op.SetTenantOrigins(e.ctx, ten.ID, want); err != nil {
		t.Fatal(err)
	}
	// Clearing.
	if ch, err := e.op.SetTenantOrigins(e.ctx, ten.ID, nil); err != nil || !ch.Changed || len(ch.After) != 0 {
		t.Fatalf("clear: %+v %v", ch, err)
	}
	a := e.audits("tenant:" + ten.ID)
	if len(a) != 5 || a[1].Action != "tenants.origins_set" ||
		string(a[1].Changes) != `{"after": ["http://localhost:3000", "https://shop.example.com"], "before": []}` ||
		string(a[4].Changes) != `{"after": [], "before": ["http://localhost:3000", "https://shop.example.com"]}` {
		t.Fatalf("audit: %+v", a)
	}
	if _, err := e.op.SetTenantOrigins(e.ctx, "00000000-0000-0000-0000-000000000000", nil); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown tenant: %v", err)
	}
}
