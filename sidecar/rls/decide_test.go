package rls

import (
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/sidecar/limiter"
)

type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }

// at sets the clock to a UTC time.
func (c *fakeClock) at(s string) {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	c.ms.Store(t.UnixMilli())
}

type tester struct {
	t     *testing.T
	svc   *Service
	clock *fakeClock
	lim   *limiter.Limiter
	reg   *prometheus.Registry
}

func newTester(t *testing.T, file string, o Options) *tester {
	t.Helper()
	c := &fakeClock{}
	c.at("2026-12-01T12:00:00Z")
	lim := limiter.New(limiter.Options{Now: c.now})
	reg := prometheus.NewRegistry()
	o.Metrics = NewMetrics(reg)
	var rules *Rules
	if file != "" {
		var err error
		if rules, err = ParseFiles(map[string]string{"rules.yaml": file}); err != nil {
			t.Fatal(err)
		}
	}
	return &tester{t: t, svc: New(lim, rules, o), clock: c, lim: lim, reg: reg}
}

// desc is a descriptor of key=value entries.
func desc(kvs ...string) Descriptor {
	var d Descriptor
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		d.Entries = append(d.Entries, Entry{k, v})
	}
	return d
}

func (d Descriptor) hits(n uint64) Descriptor { d.HasHits, d.Hits = true, n; return d }
func (d Descriptor) refund(n uint64) Descriptor {
	d = d.hits(n)
	d.Refund = true
	return d
}
func (d Descriptor) override(perUnit uint32, u Unit) Descriptor {
	d.HasOverride, d.Override = true, Override{PerUnit: perUnit, Unit: u}
	return d
}

func (tt *tester) ask(domain string, ds ...Descriptor) *Response {
	tt.t.Helper()
	return tt.askHits(domain, 0, ds...)
}

func (tt *tester) askHits(domain string, hits uint32, ds ...Descriptor) *Response {
	tt.t.Helper()
	resp := &Response{}
	if err := tt.svc.Decide(&Request{Domain: domain, Descriptors: ds, Hits: hits}, resp); err != nil {
		tt.t.Fatal(err)
	}
	return resp
}

// st formats a status as a compact string: code, limit, remaining, reset.
func st(s Status) string {
	code := map[Code]string{OK: "OK", OverLimit: "OVER"}[s.Code]
	if !s.HasLimit {
		if s.Remaining != 0 {
			return fmt.Sprintf("%s rem=%d", code, s.Remaining)
		}
		return code
	}
	lim := fmt.Sprintf("%d/%s", s.Limit.PerUnit, s.Limit.Unit)
	if s.Limit.Multiplier != 0 {
		lim = fmt.Sprintf("%d/%d%s", s.Limit.PerUnit, s.Limit.Multiplier, s.Limit.Unit)
	}
	if s.Limit.Name != "" {
		lim += "(" + s.Limit.Name + ")"
	}
	return fmt.Sprintf("%s %s rem=%d reset=%d", code, lim, s.Remaining, s.Reset)
}

func (tt *tester) want(resp *Response, code Code, statuses ...string) {
	tt.t.Helper()
	var got []string
	for _, s := range resp.Statuses {
		got = append(got, st(s))
	}
	if resp.Code != code || strings.Join(got, "; ") != strings.Join(statuses, "; ") {
		tt.t.Fatalf("got %v [%s]\nwant %v [%s]", resp.Code, strings.Join(got, "; "), code, strings.Join(statuses, "; "))
	}
}

// RLS.md §6, the worked example, to the letter.
func TestWorkedExample(t *testing.T) {
	tt := newTester(t, `domain: storefront
descriptors:
  - key: client_id
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: client_id
    value: healthcheck
    rate_limit: {unlimited: true}
`, Options{ResponseHeaders: true})
	tt.clock.at("2026-12-01T12:00:50Z")
	req := []Descriptor{desc("client_id=c9"), desc("client_id=healthcheck"), desc("country=fr")}
	for i := range 3 {
		r := tt.ask("storefront", req...)
		tt.want(r, OK, fmt.Sprintf("OK 3/MINUTE rem=%d reset=10", 2-i), "OK rem=4294967295", "OK")
	}
	r := tt.ask("storefront", req...)
	tt.want(r, OverLimit, "OVER 3/MINUTE rem=0 reset=10", "OK rem=4294967295", "OK")
	if r.Header != 0 {
		t.Fatalf("headers describe status %d, want 0", r.Header)
	}
	// With hits_addend 0 on the first descriptor: checked, not counted (3 stays 3 if it
	// had been the fourth; here the counter is at 4, over).
	tt.clock.at("2026-12-01T12:01:00Z")
	for range 3 {
		tt.ask("storefront", desc("client_id=c9"))
	}
	tt.want(tt.ask("storefront", desc("client_id=c9").hits(0)), OK, "OK 3/MINUTE rem=0 reset=60")
	tt.want(tt.ask("storefront", desc("client_id=c9").hits(0)), OK, "OK 3/MINUTE rem=0 reset=60")
}

// RLS.md §3: the walk, exact before wildcard before bare key, full depth only.
func TestMatching(t *testing.T) {
	tt := newTester(t, `domain: maps
descriptors:
  - key: tenant
    value: t1
    rate_limit: {unit: day, requests_per_unit: 1000}
    descriptors:
      - key: api
        value: tiles
        rate_limit: {unit: day, requests_per_unit: 50}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /api/v1/*
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: path
    value: /api/v1/exact
    rate_limit: {unit: second, requests_per_unit: 30}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 40}
  - key: path
    value: /health
  - key: any
    value: '*'
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: route
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 60}
`, Options{})
	for _, tc := range []struct {
		d    Descriptor
		want string
	}{
		{desc("tenant=t1"), "OK 1000/DAY rem=999 reset=43200"},
		{desc("tenant=t1", "api=tiles"), "OK 50/DAY rem=49 reset=43200"},
		{desc("tenant=t1", "api=geocode"), "OK"},
		{desc("tenant=t1", "api=tiles", "zoom=3"), "OK"},
		{desc("api=tiles"), "OK"},
		{desc("tenant=t2"), "OK"},
		{desc("path=/api/v1/x"), "OK 10/SECOND rem=9 reset=1"},      // the first pattern listed
		{desc("path=/api/"), "OK 10/SECOND rem=9 reset=1"},          // * matches nothing too
		{desc("path=/api/v1/exact"), "OK 30/SECOND rem=29 reset=1"}, // exact before patterns
		{desc("path=/other"), "OK 40/SECOND rem=39 reset=1"},        // the bare key
		{desc("path="), "OK 40/SECOND rem=39 reset=1"},              // an empty value: the bare key
		{desc("path=/health"), "OK"},                                // whitelisted: no limit, not the bare key's
		{desc("any="), "OK 50/SECOND rem=49 reset=1"},               // a lone * matches the empty value
		{desc("route=/x"), "OK"},                                    // a path, no limit of its own
		{desc("route=/x", "user=u"), "OK 60/SECOND rem=59 reset=1"},
		{desc("Tenant=t1"), "OK"}, // case-sensitive
		{desc(), "OK"},            // no entries
	} {
		r := tt.ask("maps", tc.d)
		if got := st(r.Statuses[0]); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.d.Entries, got, tc.want)
		}
	}
	tt.want(tt.ask("nowhere", desc("tenant=t1")), OK, "OK")
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"api/*", "api/", true}, {"api/*", "api/v1/x", true}, {"api/*", "ap", false},
		{"*/admin", "x/admin", true}, {"*/admin", "/admin", true}, {"*/admin", "x/admins", false},
		{"v*-*-prod", "v1-eu-prod", true}, {"v*-*-prod", "v1-prod", false}, {"v*-*-prod", "v--prod", true},
		{"*", "", true}, {"*", "anything", true}, {"a*a", "a", false}, {"a*a", "aa", true},
		{"**", "x", true}, {"a*b*c", "abc", true}, {"a*b*c", "acb", false}, {"a*b*c", "axbyc", true},
		{"exact", "exact", true}, {"exact", "exac", false},
	} {
		if got := wildcardMatch(tc.pattern, tc.s); got != tc.want {
			t.Errorf("wildcardMatch(%q, %q) = %v", tc.pattern, tc.s, got)
		}
	}
}

// RLS.md §4.1: a counter per descriptor value, window and domain; keys and values never
// alias; identical descriptors share a counter and both count; a reload keeps counts.
func TestCounters(t *testing.T) {
	file := "domain: d\ndescriptors:\n  - {key: a_b, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: a, descriptors: [{key: x}]}\n  - {key: a, value: b_c, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: ip, rate_limit: {unit: minute, requests_per_unit: 2}}\n"
	tt := newTester(t, file, Options{})
	tt.want(tt.ask("d", desc("ip=1"), desc("ip=1")), OK, "OK 2/MINUTE rem=1 reset=60", "OK 2/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("ip=2")), OK, "OK 2/MINUTE rem=1 reset=60")
	tt.want(tt.ask("d", desc("ip=1")), OverLimit, "OVER 2/MINUTE rem=0 reset=60")
	// (a_b=c) and (a=b_c) are different entries with different counters.
	tt.want(tt.ask("d", desc("a_b=c"), desc("a=b_c")), OK, "OK 5/MINUTE rem=4 reset=60", "OK 5/MINUTE rem=4 reset=60")
	// A reload that raises the limit keeps the window's count.
	raised, err := ParseFiles(map[string]string{"rules.yaml": strings.Replace(file, "requests_per_unit: 2", "requests_per_unit: 10", 1)})
	if err != nil {
		t.Fatal(err)
	}
	tt.svc.SetRules(raised)
	tt.want(tt.ask("d", desc("ip=1")), OK, "OK 10/MINUTE rem=6 reset=60")
	// The window's length is part of the id: an override by the hour is a new counter.
	tt.want(tt.ask("d", desc("ip=1").override(100, Hour)), OK, "OK 100/HOUR rem=99 reset=3600")
}

// RLS.md §4.2: windows aligned to the epoch; a month is 30 days, a year 365, a week
// starts on Thursday; duration_until_reset is whole seconds, from 1 to the length.
func TestWindows(t *testing.T) {
	tt := newTester(t, `domain: w
descriptors:
  - {key: s, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: m, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: h, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 1}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: mo, rate_limit: {unit: month, requests_per_unit: 1}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 1}}
`, Options{})
	// 2026-12-03 is a Thursday; 12:34:56.789 into it.
	tt.clock.at("2026-12-03T12:34:56.789Z")
	now := tt.clock.ms.Load() / 1000
	for _, tc := range []struct {
		key  string
		secs int64
	}{{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86_400}, {"w", 604_800}, {"mo", 2_592_000}, {"y", 31_536_000}} {
		r := tt.ask("w", desc(tc.key+"=x"))
		want := tc.secs - now%tc.secs
		if got := r.Statuses[0].Reset; got != want || got < 1 || got > tc.secs {
			t.Errorf("%s: reset %d, want %d", tc.key, got, want)
		}
	}
	// The week began on Thursday 00:00 UTC: 12:34:56.789 in, so 6 days 11:25:04 are left.
	if r := tt.ask("w", desc("w=y")); r.Statuses[0].Reset != 6*86_400+11*3600+25*60+4 {
		t.Errorf("week reset %d", r.Statuses[0].Reset)
	}
	// A new window: every counter starts again.
	tt.clock.ms.Add(1000)
	tt.want(tt.ask("w", desc("s=x")), OK, "OK 1/SECOND rem=0 reset=1")
	tt.want(tt.ask("w", desc("m=x")), OverLimit, "OVER 1/MINUTE rem=0 reset=3")
	// On a whole second, the reset is the whole window.
	tt.clock.at("2026-12-03T12:35:00Z")
	tt.want(tt.ask("w", desc("m=z")), OK, "OK 1/MINUTE rem=0 reset=60")
}

// RLS.md §4.4: hits_addend, of the request and of a descriptor.
func TestHitsAddend(t *testing.T) {
	tt := newTester(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 5}}\n", Options{})
	tt.want(tt.askHits("d", 3, desc("k=a")), OK, "OK 5/MINUTE rem=2 reset=60")
	tt.want(tt.askHits("d", 3, desc("k=a").hits(0)), OK, "OK 5/MINUTE rem=2 reset=60") // checks only
	tt.want(tt.askHits("d", 3, desc("k=a").hits(2)), OK, "OK 5/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("k=a").hits(0)), OK, "OK 5/MINUTE rem=0 reset=60") // full: OK, 0 left
	tt.want(tt.ask("d", desc("k=b").hits(3)), OK, "OK 5/MINUTE rem=2 reset=60")
	tt.want(tt.ask("d", desc("k=b").hits(4)), OverLimit, "OVER 5/MINUTE rem=0 reset=60") // 3 + 4 = 7 > 5
	tt.want(tt.ask("d", desc("k=b").hits(0)), OverLimit, "OVER 5/MINUTE rem=0 reset=60") // over-full: over
	tt.want(tt.ask("d", desc("k=c").hits(math.MaxUint64)), OverLimit, "OVER 5/MINUTE rem=0 reset=60")
}

// RLS.md §4.5: a descriptor's limit override.
func TestOverride(t *testing.T) {
	tt := newTester(t, `domain: d
descriptors:
  - key: k
    value: free
    shadow_mode: true
    rate_limit: {unlimited: true, name: n}
  - {key: j, rate_limit: {unit: minute, requests_per_unit: 50}}
`, Options{})
	// Whether or not a rule matches; the rule's unlimited, shadow mode and name ignored.
	tt.want(tt.ask("d", desc("k=free").override(1, Minute)), OK, "OK 1/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("k=free").override(1, Minute)), OverLimit, "OVER 1/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("other=x").override(2, Second)), OK, "OK 2/SECOND rem=1 reset=1")
	tt.want(tt.ask("d", desc().override(2, Second)), OK, "OK 2/SECOND rem=1 reset=1")
	// With the rule's unit it continues the rule's counter; another number keeps the count.
	tt.ask("d", desc("j=x"))
	tt.want(tt.ask("d", desc("j=x").override(3, Minute)), OK, "OK 3/MINUTE rem=1 reset=60")
	tt.want(tt.ask("d", desc("j=x")), OK, "OK 50/MINUTE rem=47 reset=60")
	// In an unknown domain it is ignored.
	tt.want(tt.ask("nowhere", desc("k=x").override(0, Second)), OK, "OK")
	// A unit that is none is refused, not a crash (RLS.md §9.1); WEEK (7) is one.
	for _, u := range []Unit{UnitUnknown, 8, -1} {
		err := tt.svc.Decide(&Request{Domain: "d", Descriptors: []Descriptor{desc("k=x").override(1, u)}}, &Response{})
		if !IsRequestError(err) || !strings.Contains(err.Error(), "no valid unit") {
			t.Errorf("unit %d: %v", u, err)
		}
	}
	// Tuesday 12:00: the week began on Thursday, 1.5 days are left.
	tt.want(tt.ask("d", desc("k=x").override(1, Week)), OK, "OK 1/WEEK rem=0 reset=129600")
}

// RLS.md §5.3: replaces, whatever the order.
func TestReplaces(t *testing.T) {
	tt := newTester(t, `domain: shop
descriptors:
  - key: partner
    rate_limit: {unit: minute, requests_per_unit: 1, name: partner_default}
  - key: promo
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: partner_default}]}
  - key: vip
    rate_limit: {unlimited: true, replaces: [{name: partner_default}]}
`, Options{})
	for i := range 3 {
		tt.want(tt.ask("shop", desc("partner=p"), desc("promo=x")), OK, "OK", fmt.Sprintf("OK 100/MINUTE rem=%d reset=60", 99-i))
	}
	tt.want(tt.ask("shop", desc("promo=y"), desc("partner=p")), OK, "OK 100/MINUTE rem=99 reset=60", "OK")
	tt.want(tt.ask("shop", desc("partner=p"), desc("vip=v")), OK, "OK", "OK rem=4294967295")
	// Alone, the named rule applies, and the replaced requests did not count on it.
	tt.want(tt.ask("shop", desc("partner=p")), OK, "OK 1/MINUTE(partner_default) rem=0 reset=60")
	tt.want(tt.ask("shop", desc("partner=p")), OverLimit, "OVER 1/MINUTE(partner_default) rem=0 reset=60")
}

// RLS.md §5.5 and §5.6: shadow mode per rule and global, and quota mode.
func TestShadowAndQuota(t *testing.T) {
	file := `domain: d
descriptors:
  - {key: s, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: n, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: q, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
`
	tt := newTester(t, file, Options{ResponseHeaders: true})
	tt.ask("d", desc("s=1"))
	r := tt.ask("d", desc("s=1"), desc("n=1"))
	tt.want(r, OK, "OK 1/MINUTE rem=0 reset=60", "OK 1/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("s=1"), desc("n=1")), OverLimit, "OK 1/MINUTE rem=0 reset=60", "OVER 1/MINUTE rem=0 reset=60")
	if got := testutil.ToFloat64(tt.svc.opts.Metrics.shadow.WithLabelValues("d", "d.s")); got != 2 {
		t.Errorf("shadow_mode counted %v hits, want 2", got)
	}

	// Quota mode: over only when every quota descriptor is.
	tt.ask("d", desc("q=a"))
	r = tt.ask("d", desc("q=a"), desc("q=b"))
	tt.want(r, OK, "OVER 1/MINUTE rem=0 reset=60", "OK 1/MINUTE rem=0 reset=60")
	if r.Header != 0 {
		t.Errorf("header %d: a quota descriptor over counts as 0 remaining, the first with the least", r.Header)
	}
	tt.want(tt.ask("d", desc("q=a"), desc("q=b")), OverLimit, "OVER 1/MINUTE rem=0 reset=60", "OVER 1/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("q=c"), desc("n=1")), OverLimit, "OK 1/MINUTE rem=0 reset=60", "OVER 1/MINUTE rem=0 reset=60")

	// Global shadow mode: every status as it is, the overall code OK.
	tg := newTester(t, file, Options{ShadowMode: true, ResponseHeaders: true})
	tg.ask("d", desc("n=1"))
	r = tg.ask("d", desc("s=9"), desc("n=1"))
	tg.want(r, OK, "OK 1/MINUTE rem=0 reset=60", "OVER 1/MINUTE rem=0 reset=60")
	if r.Header != 1 {
		t.Errorf("header %d in global shadow mode, want the over-limit descriptor", r.Header)
	}
	if got := testutil.ToFloat64(tg.svc.opts.Metrics.globalShadow); got != 1 {
		t.Errorf("global_shadow_mode %v", got)
	}
}

// RLS.md §5.7: which status the headers describe.
func TestHeaderStatus(t *testing.T) {
	tt := newTester(t, "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: b, rate_limit: {unit: minute, requests_per_unit: 3}}\n  - {key: u, rate_limit: {unlimited: true}}\n", Options{ResponseHeaders: true})
	if r := tt.ask("d", desc("u=1"), desc("x=1")); r.Header != -1 {
		t.Errorf("no limit: header %d", r.Header)
	}
	if r := tt.ask("d", desc("u=1"), desc("a=1"), desc("b=1"), desc("b=2")); r.Header != 2 {
		t.Errorf("the first with the least remaining: %d", r.Header)
	}
	tt.ask("d", desc("b=3").hits(3))
	tt.ask("d", desc("b=4").hits(3))
	if r := tt.ask("d", desc("b=3"), desc("a=1"), desc("b=4"), desc("a=2")); r.Header != 2 {
		t.Errorf("the last over: %d", r.Header)
	}
	off := newTester(t, "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: minute, requests_per_unit: 5}}\n", Options{})
	if r := off.ask("d", desc("a=1")); r.Header != -1 {
		t.Errorf("headers off: %d", r.Header)
	}
}

// RLS.md §4.6: share_threshold.
func TestShareThreshold(t *testing.T) {
	tt := newTester(t, `domain: d
descriptors:
  - {key: path, value: 'files/*', share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: path, value: 'files/index', rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: path, value: 'docs/*', rate_limit: {unit: minute, requests_per_unit: 3}}
  - key: t
    value: 'a*'
    share_threshold: true
    descriptors:
      - {key: u, value: 'b*', share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 2}}
`, Options{})
	tt.want(tt.ask("d", desc("path=files/a")), OK, "OK 3/MINUTE rem=2 reset=60")
	tt.want(tt.ask("d", desc("path=files/b")), OK, "OK 3/MINUTE rem=1 reset=60")
	tt.want(tt.ask("d", desc("path=files/index")), OK, "OK 3/MINUTE rem=2 reset=60") // its own rule and counter
	tt.want(tt.ask("d", desc("path=docs/a")), OK, "OK 3/MINUTE rem=2 reset=60")
	tt.want(tt.ask("d", desc("path=docs/b")), OK, "OK 3/MINUTE rem=2 reset=60") // not shared
	tt.want(tt.ask("d", desc("t=a1", "u=b1")), OK, "OK 2/MINUTE rem=1 reset=60")
	tt.want(tt.ask("d", desc("t=a2", "u=b2")), OK, "OK 2/MINUTE rem=0 reset=60")
	tt.want(tt.ask("d", desc("t=a3", "u=b3")), OverLimit, "OVER 2/MINUTE rem=0 reset=60")
}

// RLS.md §1.4: the errors of a request.
func TestRequestErrors(t *testing.T) {
	tt := newTester(t, "", Options{})
	for _, tc := range []struct {
		req  Request
		want string
	}{
		{Request{Descriptors: []Descriptor{desc("a=b")}}, "rate limit domain must not be empty"},
		{Request{Domain: "d"}, "rate limit descriptor list must not be empty"},
		{Request{Domain: "d", Descriptors: make([]Descriptor, MaxDescriptors+1)}, "at most 256 descriptors"},
		{Request{Domain: "d", Descriptors: []Descriptor{{Entries: make([]Entry, MaxEntries+1)}}}, "at most 64 entries"},
	} {
		err := tt.svc.Decide(&tc.req, &Response{})
		if err == nil || err.Error() != tc.want && !strings.Contains(err.Error(), tc.want) || !IsRequestError(err) {
			t.Errorf("%+v: %v, want %q", tc.req.Domain, err, tc.want)
		}
	}
	// No rules at all: every request is OK with no limits.
	tt.want(tt.ask("any", desc("a=b"), desc()), OK, "OK", "OK")
}

// Beyond the reference: several limits on one descriptor, each its own counter.
func TestSeveralLimits(t *testing.T) {
	tt := newTester(t, `domain: api
descriptors:
  - key: client
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: burst}
      - {unit: day, requests_per_unit: 3, name: daily}
`, Options{})
	tt.want(tt.ask("api", desc("client=c")), OK, "OK 2/SECOND(burst) rem=1 reset=1")
	tt.want(tt.ask("api", desc("client=c")), OK, "OK 2/SECOND(burst) rem=0 reset=1") // 0 left of 2, 1 of 3
	tt.want(tt.ask("api", desc("client=c")), OverLimit, "OVER 2/SECOND(burst) rem=0 reset=1")
	tt.clock.ms.Add(1000)
	// The burst is back, the day's quota is used up (denied hits count, as in the reference).
	tt.want(tt.ask("api", desc("client=c")), OverLimit, "OVER 3/DAY(daily) rem=0 reset=43199")
}

// Beyond the reference: windows of unit_multiplier units, aligned to the epoch.
func TestUnitMultiplier(t *testing.T) {
	tt := newTester(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 2}}\n  - {key: h, rate_limit: {unit: hour, unit_multiplier: 1, requests_per_unit: 2}}\n", Options{})
	tt.clock.at("2026-12-01T12:03:30Z")
	tt.want(tt.ask("d", desc("k=a")), OK, "OK 2/5MINUTE rem=1 reset=90")
	tt.want(tt.ask("d", desc("h=a")), OK, "OK 2/HOUR rem=1 reset=3390") // 1: the reference's answer
	tt.clock.at("2026-12-01T12:04:59Z")
	tt.want(tt.ask("d", desc("k=a")), OK, "OK 2/5MINUTE rem=0 reset=1")
	tt.clock.at("2026-12-01T12:05:00Z")
	tt.want(tt.ask("d", desc("k=a")), OK, "OK 2/5MINUTE rem=1 reset=300")
	// An override may carry one too.
	d := desc("k=b")
	d.HasOverride, d.Override = true, Override{PerUnit: 1, Unit: Second, Multiplier: 30}
	tt.want(tt.ask("d", d), OK, "OK 1/30SECOND rem=0 reset=30")
}

// Beyond the reference (its #185): count_denied: false counts hits only when the request
// is allowed.
func TestDeniedHitsNotCounted(t *testing.T) {
	tt := newTester(t, `domain: d
descriptors:
  - key: client
    count_denied: false
    rate_limits:
      - {unit: second, requests_per_unit: 2}
      - {unit: day, requests_per_unit: 5}
  - {key: path, rate_limit: {unit: day, requests_per_unit: 1}}
`, Options{})
	tt.want(tt.ask("d", desc("client=c")), OK, "OK 2/SECOND rem=1 reset=1")
	tt.want(tt.ask("d", desc("client=c")), OK, "OK 2/SECOND rem=0 reset=1")
	for range 5 { // denied by the burst: the day's quota is not used
		tt.want(tt.ask("d", desc("client=c")), OverLimit, "OVER 2/SECOND rem=0 reset=1")
	}
	tt.clock.ms.Add(1000)
	tt.want(tt.ask("d", desc("client=c")), OK, "OK 2/SECOND rem=1 reset=1")
	// Denied by another descriptor: not counted either.
	tt.ask("d", desc("path=/x"))
	tt.want(tt.ask("d", desc("client=c"), desc("path=/x")), OverLimit, "OK 2/SECOND rem=1 reset=1", "OVER 1/DAY rem=0 reset=43199")
	tt.want(tt.ask("d", desc("client=c")), OK, "OK 2/SECOND rem=0 reset=1")
	tt.clock.ms.Add(1000)
	tt.want(tt.ask("d", desc("client=c")), OK, "OK 5/DAY rem=0 reset=43198") // 5 of 5 counted
	tt.want(tt.ask("d", desc("client=c")), OverLimit, "OVER 5/DAY rem=0 reset=43198")
}

// Beyond the reference: refunds through is_negative_hits on a rule that allows them.
func TestRefunds(t *testing.T) {
	tt := newTester(t, `domain: d
descriptors:
  - {key: job, allow_refunds: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: other, rate_limit: {unit: minute, requests_per_unit: 3}}
`, Options{})
	for i := range 3 {
		tt.want(tt.ask("d", desc("job=j")), OK, fmt.Sprintf("OK 3/MINUTE rem=%d reset=60", 2-i))
	}
	tt.want(tt.ask("d", desc("job=j")), OverLimit, "OVER 3/MINUTE rem=0 reset=60")  // 4 counted
	tt.want(tt.ask("d", desc("job=j").refund(2)), OK, "OK 3/MINUTE rem=1 reset=60") // 4 - 2
	tt.want(tt.ask("d", desc("job=j")), OK, "OK 3/MINUTE rem=0 reset=60")
	// Never below nothing: a refund of 10 gives back the 3 counted.
	tt.want(tt.ask("d", desc("job=j").refund(10)), OK, "OK 3/MINUTE rem=3 reset=60")
	tt.want(tt.ask("d", desc("job=j").hits(3)), OK, "OK 3/MINUTE rem=0 reset=60")
	// A rule without allow_refunds: is_negative_hits checks without counting.
	tt.ask("d", desc("other=o"))
	tt.want(tt.ask("d", desc("other=o").refund(5)), OK, "OK 3/MINUTE rem=2 reset=60")
	tt.want(tt.ask("d", desc("other=o")), OK, "OK 3/MINUTE rem=1 reset=60")
	// The refunds are their own counter, replicated like the hits.
	if _, ok := tt.lim.Lookup(limiter.Key{Bucket: tt.lim.Bucket(Bucket + limiter.RefundSuffix), ID: "d|job=j|60s"}); !ok {
		t.Error("no refund counter")
	}
	// A new window forgets both.
	tt.clock.ms.Add(60_000)
	tt.want(tt.ask("d", desc("job=j").refund(1)), OK, "OK 3/MINUTE rem=3 reset=60")
}

// Per-rule statistics, as the reference counts them.
func TestRuleStatistics(t *testing.T) {
	tt := newTester(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 10}}\n", Options{})
	tt.ask("d", desc("k=a").hits(7))
	tt.ask("d", desc("k=a").hits(2)) // 9: near (past 8)
	tt.ask("d", desc("k=a").hits(3)) // 12: 2 over, 1 near
	m := tt.svc.opts.Metrics
	for _, tc := range []struct {
		v    *prometheus.CounterVec
		want float64
	}{{m.hits, 12}, {m.within, 9}, {m.near, 2}, {m.over, 2}, {m.shadow, 0}} {
		if got := testutil.ToFloat64(tc.v.WithLabelValues("d", "d.k")); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.v, got, tc.want)
		}
	}
	// A reload drops the series of rules that are gone.
	r, _ := ParseFiles(map[string]string{"x.yaml": "domain: e\n"})
	tt.svc.SetRules(r)
	if n := testutil.CollectAndCount(m.hits); n != 1 { // e's _override only
		t.Errorf("%d series after the reload", n)
	}
}

// The buckets are names the cluster accepts from other nodes.
func TestBucketNames(t *testing.T) {
	if !buckets.ValidName(Bucket) || !buckets.ValidName(Bucket+limiter.RefundSuffix) {
		t.Fatal("invalid bucket names")
	}
}

// Counter ids: escaped, unambiguous, bounded.
func TestIDs(t *testing.T) {
	for _, tc := range []struct {
		domain  string
		entries []Entry
		share   []string
		want    string
	}{
		{"shop", []Entry{{"client_id", "c9"}}, nil, "shop|client_id=c9|60s"},
		{"a|b", []Entry{{"k=", "v|%"}}, nil, "a%7Cb|k%3D=v%7C%25|60s"},
		{"d", nil, nil, "d|60s"},
		{"d", []Entry{{"t", "a1"}, {"u", "b1"}}, []string{"", "b*"}, "d|t=a1|u=b*|60s"},
	} {
		if got := string(appendID(nil, tc.domain, tc.entries, tc.share, 60)); got != tc.want {
			t.Errorf("id %q, want %q", got, tc.want)
		}
	}
	long := string(appendID(nil, "d", []Entry{{"k", strings.Repeat("v", 1000)}}, nil, 60))
	if len(long) != 65 || long[0] != '#' {
		t.Errorf("long id %q", long)
	}
}

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }
