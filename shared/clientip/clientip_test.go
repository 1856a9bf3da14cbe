package clientip

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseHost(t *testing.T) {
	good := map[string]string{
		"192.0.2.1":            "192.0.2.1",
		"192.0.2.1:8080":       "192.0.2.1",
		"2001:db8::1":          "2001:db8::1",
		"[2001:db8::1]":        "2001:db8::1",
		"[2001:db8::1]:443":    "2001:db8::1",
		"::ffff:192.0.2.9":     "192.0.2.9",
		"[::ffff:192.0.2.9]:1": "192.0.2.9",
		"fe80::1%eth0":         "fe80::1",
		"2001:0db8:0000::0001": "2001:db8::1",
		"::1":                  "::1",
		"[::1]:65535":          "::1",
	}
	for in, want := range good {
		a, ok := ParseHost(in)
		if !ok || a.String() != want {
			t.Errorf("ParseHost(%q) = %v, %v; want %s", in, a, ok, want)
		}
	}
	for _, in := range []string{"", "unknown", "_hidden", "192.0.2.1:", "192.0.2.1:x", "192.0.2.1:123456",
		"[2001:db8::1", "[2001:db8::1]x", "[2001:db8::1]:", "300.1.1.1", "1.2.3", "example.com", "example.com:80",
		strings.Repeat("1", 100)} {
		if a, ok := ParseHost(in); ok {
			t.Errorf("ParseHost(%q) = %v, want failure", in, a)
		}
	}
}

func TestParseTrusted(t *testing.T) {
	r, err := Parse("10.0.0.0/8, 192.0.2.7 2001:db8::/32,::ffff:172.16.0.0/108")
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]bool{
		"10.1.2.3": true, "::ffff:10.1.2.3": true, "192.0.2.7": true, "192.0.2.8": false,
		"2001:db8:5::1": true, "2001:db9::1": false, "172.16.5.5": true, "172.32.0.1": false,
	} {
		a, _ := ParseHost(in)
		if got := r.Trusted(a); got != want {
			t.Errorf("Trusted(%s) = %v, want %v", in, got, want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "nonsense", "10.0.0.1/8/1", "fe80::1%eth0"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
	if r, err := Parse(""); err != nil || len(r.trusted) != 0 {
		t.Errorf("empty: %v %v", r, err)
	}
}

func TestResolve(t *testing.T) {
	r, err := Parse("10.0.0.0/8,2001:db8:ffff::/48")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, source, xff, want string
	}{
		{"untrusted source ignores the header", "203.0.113.5", "198.51.100.1", "203.0.113.5"},
		{"trusted source, one client", "10.0.0.2", "198.51.100.1", "198.51.100.1"},
		{"skips trusted hops right to left", "10.0.0.2", "198.51.100.1, 203.0.113.9, 10.1.1.1, 10.2.2.2", "203.0.113.9"},
		{"spoofed left entries are ignored", "10.0.0.2", "1.1.1.1, 198.51.100.1", "198.51.100.1"},
		{"all trusted gives the left-most", "10.0.0.2", "10.9.9.9, 10.8.8.8", "10.9.9.9"},
		{"no header gives the source", "10.0.0.2", "", "10.0.0.2"},
		{"unparsable stops at the last trusted hop", "10.0.0.2", "198.51.100.1, garbage, 10.3.3.3", "10.3.3.3"},
		{"unparsable right after source", "10.0.0.2", "198.51.100.1, unknown", "10.0.0.2"},
		{"empty entry is unparsable", "10.0.0.2", "198.51.100.1,,10.3.3.3", "10.3.3.3"},
		{"v4 with port", "10.0.0.2", "198.51.100.1:5555", "198.51.100.1"},
		{"v6 client", "10.0.0.2", "2001:db8:1::7", "2001:db8:1::7"},
		{"bracketed v6 with port", "10.0.0.2", "[2001:db8:1::7]:443", "2001:db8:1::7"},
		{"trusted v6 hop", "[2001:db8:ffff::1]:80", "198.51.100.4, 2001:db8:ffff::2", "198.51.100.4"},
		{"mapped source matches v4 range", "::ffff:10.0.0.2", "198.51.100.1", "198.51.100.1"},
		{"mapped entry matches v4 range", "10.0.0.2", "198.51.100.1, ::ffff:10.4.4.4", "198.51.100.1"},
		{"mapped client is reported as v4", "10.0.0.2", "::ffff:198.51.100.1", "198.51.100.1"},
	}
	for _, c := range cases {
		a, ok := r.Resolve(c.source, c.xff)
		if !ok || a.String() != c.want {
			t.Errorf("%s: Resolve(%q, %q) = %v, %v; want %s", c.name, c.source, c.xff, a, ok, c.want)
		}
	}
	if _, ok := r.Resolve("not-an-ip", "198.51.100.1"); ok {
		t.Error("a non-IP source resolved")
	}
	if a, _ := (&Resolver{}).Resolve("10.0.0.2", "198.51.100.1"); a.String() != "10.0.0.2" {
		t.Errorf("no trusted proxies: %v, want the source", a)
	}
}

func TestResolveBoundsTheWalk(t *testing.T) {
	r, _ := Parse("10.0.0.0/8")
	xff := "198.51.100.1," + strings.Repeat("10.0.0.1,", 10_000) + "10.0.0.1"
	a, ok := r.Resolve("10.0.0.2", xff)
	if !ok || a.String() != "10.0.0.1" {
		t.Fatalf("huge header: %v %v; want the last trusted hop walked", a, ok)
	}
}

func TestKey(t *testing.T) {
	r := &Resolver{}
	for in, want := range map[string]string{
		"192.0.2.1":                               "192.0.2.1",
		"::ffff:192.0.2.1":                        "192.0.2.1",
		"2001:db8:1:2:3:4:5:6":                    "2001:db8:1:2::/64",
		"2001:0DB8:0001:0002::ffff":               "2001:db8:1:2::/64",
		"fe80::1%eth0":                            "fe80::/64",
		"2001:db8:1:3::1":                         "2001:db8:1:3::/64",
		"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff": "ffff:ffff:ffff:ffff::/64",
	} {
		a, ok := ParseHost(in)
		if !ok {
			a = mustAddr(t, in)
		}
		if got := r.Key(a); got != want {
			t.Errorf("Key(%s) = %s, want %s", in, got, want)
		}
	}
	a, _ := ParseHost("2001:db8:1:2:3:4:5:6")
	if got := (&Resolver{}).SetIPv6Prefix(48).Key(a); got != "2001:db8:1::/48" {
		t.Errorf("/48: %s", got)
	}
	if got := (&Resolver{}).SetIPv6Prefix(128).Key(a); got != "2001:db8:1:2:3:4:5:6" {
		t.Errorf("/128: %s", got)
	}
	if k, ok := r.ClientKey("[2001:db8::9]:443", ""); !ok || k != "2001:db8::/64" {
		t.Errorf("ClientKey = %q, %v", k, ok)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestLoad(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	r, err := Load(env(nil))
	if err != nil || r.IPv6Prefix() != 64 {
		t.Fatalf("defaults: %v %v", r, err)
	}
	if r, err = Load(env(map[string]string{"CLIENT_IPV6_PREFIX": "/56"})); err != nil || r.IPv6Prefix() != 56 {
		t.Fatalf("/56: %v %v", r, err)
	}
	for _, bad := range []string{"0", "31", "129", "x", "64/"} {
		if _, err := Load(env(map[string]string{"CLIENT_IPV6_PREFIX": bad})); err == nil || !strings.Contains(err.Error(), "CLIENT_IPV6_PREFIX") {
			t.Errorf("CLIENT_IPV6_PREFIX=%s: %v", bad, err)
		}
	}
	if _, err := Load(env(map[string]string{"TRUSTED_PROXIES": "nonsense"})); err == nil || !strings.Contains(err.Error(), "TRUSTED_PROXIES") {
		t.Errorf("TRUSTED_PROXIES: %v", err)
	}
}
