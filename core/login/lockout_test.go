package login_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/converger/edge/core/passwords"

	"github.com/converger/edge/shared/buckets"
	"github.com/converger/edge/shared/limiterclient"
)

const (
	invalidLogin = "Invalid email or password."
	invalidCode  = "Invalid code."
)

var lockoutText = regexp.MustCompile(`^Too many failed login attempts\. Try again in ([0-9]+) seconds\.$`)

// expectLocked checks a lockout answer: 429, a positive retry-after and the same number
// in the message. It returns the number.
func expectLocked(t *testing.T, what string, p page) int {
	t.Helper()
	m := lockoutText.FindStringSubmatch(p.text("error"))
	if p.status != 429 || m == nil || p.header.Get("retry-after") != m[1] {
		t.Fatalf("%s: %d, retry-after %q, error %q; want 429 and the lockout message with the same seconds\n%s",
			what, p.status, p.header.Get("retry-after"), p.text("error"), p.body)
	}
	n, _ := strconv.Atoi(m[1])
	if n <= 0 {
		t.Fatalf("%s: retry-after %d", what, n)
	}
	return n
}

// peekCount returns the count of a key in the limiter the pages use.
func (e *env) peekCount(bucket, key string) uint64 {
	e.t.Helper()
	r, err := e.limiter.Peek(context.Background(), bucket, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return r.Count
}

// Five wrong passwords for one account, each from another address, lock the account:
// the right password from a sixth address is answered 429 without being checked. The
// counts are in the sidecar under the documented keys.
func TestLockoutPerAccount(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	e.admin("alice@example.com", "alice-password-1", false)
	e.admin("bob@example.com", "bob-password-123", false)
	for i := 1; i <= 5; i++ {
		// The account key is trimmed and lower-cased.
		email := []string{"alice@example.com", " Alice@Example.COM ", "ALICE@example.com"}[i%3]
		p := e.browser(fmt.Sprintf("203.0.113.%d", i)).login(email, "wrong-password-"+strconv.Itoa(i))
		expectError(t, fmt.Sprintf("wrong password %d", i), p, 200, invalidLogin)
	}
	if n := e.peekCount(buckets.LoginAccount, "admin:alice@example.com"); n != 5 {
		t.Fatalf("login_account admin:alice@example.com counts %d in the sidecar, want 5", n)
	}
	if n := e.peekCount(buckets.LoginIP, "203.0.113.1"); n != 1 {
		t.Fatalf("login_ip 203.0.113.1 counts %d, want 1", n)
	}
	sixth := e.browser("203.0.113.6")
	n := expectLocked(t, "the right password of a locked account", sixth.login("alice@example.com", "alice-password-1"))
	if n > 59 {
		t.Fatalf("retry-after %d, want at most the 59 s left in the window", n)
	}
	// The address is not locked: another account signs in from it.
	expect(t, "another account from the sixth address", sixth.login("bob@example.com", "bob-password-123"), 303, "/admin")
	// Refused attempts are not counted.
	if n := e.peekCount(buckets.LoginAccount, "admin:alice@example.com"); n != 5 {
		t.Fatalf("login_account counts %d after the lockout, want still 5", n)
	}
}

// Five failures from one address, on five accounts (known or not), lock the address for
// every account.
func TestLockoutPerIP(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	e.admin("carol@example.com", "carol-password-1", false)
	for i := 1; i <= 5; i++ {
		email := fmt.Sprintf("nobody%d@example.com", i)
		if i == 3 {
			email = "carol@example.com"
		}
		expectError(t, "failure "+strconv.Itoa(i), e.browser("198.51.100.7").login(email, "not-the-password"), 200, invalidLogin)
	}
	expectLocked(t, "a sixth account from the same address", e.browser("198.51.100.7").login("carol@example.com", "carol-password-1"))
	expect(t, "the same account from another address", e.browser("198.51.100.8").login("carol@example.com", "carol-password-1"), 303, "/admin")
}

// Successful logins are not counted and do not reset the failures.
func TestSuccessNotCounted(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	e.admin("dave@example.com", "dave-password-12", false)
	// A new browser for each attempt: a signed-in one is sent from the login page to the landing page.
	b := func() *browser { return e.browser("192.0.2.10") }
	for i := range 6 {
		expect(t, "success "+strconv.Itoa(i+1), b().login("dave@example.com", "dave-password-12"), 303, "/admin")
	}
	for i := range 4 {
		expectError(t, "failure "+strconv.Itoa(i+1), b().login("dave@example.com", "wrong"), 200, invalidLogin)
	}
	expect(t, "a success after four failures", b().login("dave@example.com", "dave-password-12"), 303, "/admin")
	expectError(t, "the fifth failure", b().login("dave@example.com", "wrong"), 200, invalidLogin)
	expectLocked(t, "after five failures and a success", b().login("dave@example.com", "dave-password-12"))
	if n := e.peekCount(buckets.LoginIP, "192.0.2.10"); n != 5 {
		t.Fatalf("login_ip counts %d, want 5 (the failures only)", n)
	}
}

// A deactivated account cannot sign in, answers like a wrong password, and is not
// counted.
func TestDeactivatedNotCounted(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	u := e.admin("erin@example.com", "erin-password-12", false)
	e.admin("frank@example.com", "frank-password-1", false)
	e.exec(`UPDATE admin_users SET status = 'inactive' WHERE id = $1`, u.ID)
	b := e.browser("192.0.2.20")
	for i := range 7 {
		password := "erin-password-12"
		if i%2 == 1 {
			password = "wrong"
		}
		expectError(t, "deactivated account, attempt "+strconv.Itoa(i+1), b.login("erin@example.com", password), 200, invalidLogin)
	}
	if n := e.peekCount(buckets.LoginAccount, "admin:erin@example.com"); n != 0 {
		t.Fatalf("login_account counts %d for a deactivated account, want 0", n)
	}
	expect(t, "another account from the same address", b.login("frank@example.com", "frank-password-1"), 303, "/admin")
}

// The portal's account key holds the tenant name; both are trimmed and lower-cased.
func TestPortalLockout(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	e.tenantUser("Acme", "grace@example.com", "grace-password-1")
	e.tenantUser("Other", "grace@example.com", "grace-password-2")
	for i := 1; i <= 5; i++ {
		tenant := []string{"acme", " ACME ", "Acme"}[i%3]
		p := e.browser(fmt.Sprintf("203.0.113.%d", 100+i)).portalLogin(tenant, "Grace@example.com", "wrong")
		expectError(t, "portal failure "+strconv.Itoa(i), p, 200, invalidLogin)
	}
	if n := e.peekCount(buckets.LoginAccount, "tenant:acme:grace@example.com"); n != 5 {
		t.Fatalf("login_account tenant:acme:grace@example.com counts %d, want 5", n)
	}
	expectLocked(t, "the right password", e.browser("203.0.113.120").portalLogin("Acme", "grace@example.com", "grace-password-1"))
	// The same email at another tenant is another account.
	expect(t, "the same email at another tenant", e.browser("203.0.113.121").portalLogin("Other", "grace@example.com", "grace-password-2"),
		303, "/portal")
}

// The lockout lasts until the window ends (the sidecar's clock is the test's).
func TestLockEndsWithTheWindow(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	e.admin("heidi@example.com", "heidi-password-1", false)
	b := e.browser("192.0.2.30")
	for range 5 {
		expectError(t, "failure", b.login("heidi@example.com", "wrong"), 200, invalidLogin)
	}
	e.clock.advance(30 * time.Second)
	if n := expectLocked(t, "30 s later", b.login("heidi@example.com", "heidi-password-1")); n != 29 {
		t.Fatalf("retry-after %d, want 29 (the window ends 29 s later)", n)
	}
	e.clock.advance(29 * time.Second)
	expect(t, "when the window has ended", b.login("heidi@example.com", "heidi-password-1"), 303, "/admin")
}

// The local limiter (no LIMITER_ADDR) locks the same way.
func TestLocalLimiterLockout(t *testing.T) {
	e := newEnv(t, envOptions{})
	e.admin("ivan@example.com", "ivan-password-12", false)
	for i := 1; i <= 5; i++ {
		expectError(t, "failure", e.browser(fmt.Sprintf("203.0.113.%d", i)).login("ivan@example.com", "wrong"), 200, invalidLogin)
	}
	if n := expectLocked(t, "locked", e.browser("203.0.113.6").login("ivan@example.com", "ivan-password-12")); n != 59 {
		t.Fatalf("retry-after %d, want 59", n)
	}
	e.clock.advance(time.Minute)
	expect(t, "a minute later", e.browser("203.0.113.6").login("ivan@example.com", "ivan-password-12"), 303, "/admin")
}

// brokenLimiter answers every call with an error, as an unreachable sidecar does.
type brokenLimiter struct{}

var errDown = errors.New("connection refused")

func (brokenLimiter) Check(context.Context, string, string, uint32) (limiterclient.Result, error) {
	return limiterclient.Result{}, errDown
}
func (brokenLimiter) Peek(context.Context, string, string) (limiterclient.Result, error) {
	return limiterclient.Result{}, errDown
}
func (brokenLimiter) Take(context.Context, string, string, uint32) (limiterclient.Result, error) {
	return limiterclient.Result{}, errDown
}
func (brokenLimiter) Refund(context.Context, string, string, uint32) (limiterclient.Result, error) {
	return limiterclient.Result{}, errDown
}

// Without an answer from the limiter, logins fail closed (503) and no reset email is
// sent, with the usual answer.
func TestLimiterDownFailsClosed(t *testing.T) {
	t.Run("unreachable sidecar", func(t *testing.T) {
		// A port nothing listens on.
		client, err := limiterclient.New("127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Close() })
		e := newEnv(t, envOptions{limiter: client})
		e.admin("judy@example.com", "judy-password-12", false)
		expectError(t, "login", e.browser("192.0.2.40").login("judy@example.com", "judy-password-12"), 503,
			"Signing in is unavailable right now. Try again in a minute.")
	})
	t.Run("limiter errors", func(t *testing.T) {
		e := newEnv(t, envOptions{limiter: brokenLimiter{}})
		e.admin("judy@example.com", "judy-password-12", false)
		expect(t, "login", e.browser("192.0.2.40").login("judy@example.com", "judy-password-12"), 503, "")
		p := e.browser("192.0.2.40").submit("/admin/password/reset", "/admin/password/reset", url.Values{"email": {"judy@example.com"}})
		if p.status != 200 || p.text("notice") != resetNotice {
			t.Fatalf("reset request: %d %q", p.status, p.text("notice"))
		}
		e.pages.Close() // sends what was queued
		if got := e.mails.to("judy@example.com"); len(got) != 0 {
			t.Fatalf("%d emails sent without the limiter", len(got))
		}
	})
}

// 150 parallel wrong passwords for one account, each from its own address, check at
// most the limit: exactly 5 are checked (the form again, 200) and 145 are locked out (429) without
// their password being hashed; no more than the gate's slots hash at once; the right
// password is then locked out too, and the count is 5.
func TestParallelGuessesCheckAtMostTheLimit(t *testing.T) {
	gate := passwords.NewGate(2, time.Minute)
	e := newEnv(t, envOptions{sidecar: true, hashes: gate})
	e.admin("kim@example.com", "kim-password-123", false)
	const n = 150
	type ready struct {
		b    *browser
		form url.Values
	}
	var forms []ready
	for i := range n {
		b := e.browser(fmt.Sprintf("198.18.%d.%d", i/250, 1+i%250))
		f := b.get("/admin/login")
		forms = append(forms, ready{b, url.Values{"_csrf": {f.csrf(t)}, "email": {"kim@example.com"},
			"password": {"wrong-guess-" + strconv.Itoa(i)}}})
	}
	statuses := make([]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, r := range forms {
		wg.Go(func() {
			<-start
			statuses[i] = r.b.do("POST", "/admin/login", r.form).status
		})
	}
	close(start)
	wg.Wait()
	counts := map[int]int{}
	for _, s := range statuses {
		counts[s]++
	}
	// On a loaded machine a Limiter call can take longer than its 2 s bound: that
	// attempt fails closed (503) and is given back, so it is neither checked nor counted.
	if counts[200] > 5 || counts[200]+counts[429]+counts[503] != n || (counts[503] == 0 && counts[200] != 5) {
		t.Fatalf("answers %v, want at most 5 × 200 (checked: the form again), the rest 429 (or 503 when the limiter was too slow)", counts)
	}
	if counts[503] > 0 {
		t.Logf("answers %v: %d attempts failed closed on a slow limiter", counts, counts[503])
	}
	if gate.Peak() > 2 {
		t.Fatalf("%d password hashes ran at once, want at most 2", gate.Peak())
	}
	// Whatever the burst left, the window checks exactly 5 wrong passwords in all.
	checked := counts[200]
	for i := 0; checked < 6 && i < 20; i++ {
		p := e.browser("198.18.8.8").login("kim@example.com", "wrong-again")
		if p.status == 429 {
			break
		}
		if p.status == 200 {
			checked++
		}
	}
	if checked != 5 {
		t.Fatalf("%d wrong passwords checked in the window, want 5", checked)
	}
	expectLocked(t, "the right password", e.browser("198.18.9.9").login("kim@example.com", "kim-password-123"))
	if c := e.peekCount(buckets.LoginAccount, "admin:kim@example.com"); c != 5 {
		t.Fatalf("login_account counts %d, want 5", c)
	}
}

// The addresses of one IPv6 /64 are one client for login_ip: five failures from five of
// them lock the sixth, whatever its spelling; another /64 is not locked.
func TestIPv6LockoutPerPrefix(t *testing.T) {
	e := newEnv(t, envOptions{sidecar: true})
	e.admin("lee@example.com", "lee-password-123", false)
	for i := 1; i <= 5; i++ {
		ip := fmt.Sprintf("2001:db8:7:8:%x::%x", i*1000, i)
		expectError(t, "failure from "+ip, e.browser(ip).login(fmt.Sprintf("nobody%d@example.com", i), "wrong"), 200, invalidLogin)
	}
	for i := 6; i <= 20; i++ {
		ip := fmt.Sprintf("2001:0DB8:0007:0008:%X::%X", i*1000, i)
		expectLocked(t, "address "+strconv.Itoa(i)+" of the /64", e.browser(ip).login("lee@example.com", "lee-password-123"))
	}
	if c := e.peekCount(buckets.LoginIP, "2001:db8:7:8::/64"); c != 5 {
		t.Fatalf("login_ip 2001:db8:7:8::/64 counts %d, want 5", c)
	}
	expect(t, "another /64", e.browser("2001:db8:7:9::1").login("lee@example.com", "lee-password-123"), 303, "/admin")
}
