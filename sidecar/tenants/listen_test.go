package tenants

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/converger/edge/shared/buckets"
)

// overrideIs reports whether the tenant's current overrides set upload to count/1s.
func (e *env) overrideIs(tenantID string, count uint32) bool {
	o, st := e.d.Overrides(tenantID)
	return st == Found && o[buckets.Upload] == buckets.Limit{Count: count, Window: time.Second}
}

// listenWarning is the start of the warning of an interrupted LISTEN, in the text log.
const listenWarning = `level=WARN msg="override notifications interrupted`

func uploadLimit(count int) string {
	return `{"upload":{"limit":` + strconv.Itoa(count) + `,"scale_ms":1000}}`
}

func TestNotifyInvalidatesOverridesAtOnce(t *testing.T) {
	const ttl = 30 * time.Second
	e := newEnv(t, "", Options{OverrideTTL: ttl})
	a := e.addTenant(newKey("ck_"))
	b := e.addTenant(newKey("ck_"))
	e.listen()
	waitFor(t, 10*time.Second, "Listening", e.d.Listening)

	if o, st := e.d.Overrides(a); st != Found || len(o) != 0 {
		t.Fatalf("Overrides(a) = %v, %v", o, st)
	}
	// b is looked up in upper case; the notification carries PostgreSQL's lower case.
	bUpper := strings.ToUpper(b)
	if o, st := e.d.Overrides(bUpper); st != Found || len(o) != 0 {
		t.Fatalf("Overrides(b) = %v, %v", o, st)
	}

	// UPDATE and NOTIFY in one transaction: seen at once, without the TTL passing.
	e.setLimits(a, uploadLimit(7), true)
	waitFor(t, 5*time.Second, "the notified override of a", func() bool { return e.overrideIs(a, 7) })

	// An UPDATE without NOTIFY is not seen until the TTL passes. The notification for b,
	// sent after it, arrives on the same connection after any that a could have had, so
	// once b's new override shows, a's cached one has had every chance to be dropped.
	e.setLimits(a, uploadLimit(8), false)
	e.setLimits(b, uploadLimit(9), true)
	waitFor(t, 5*time.Second, "the notified override of b (looked up in upper case)", func() bool { return e.overrideIs(bUpper, 9) })
	if !e.overrideIs(a, 7) {
		o, st := e.d.Overrides(a)
		t.Fatalf("an UPDATE without NOTIFY was seen before the TTL: %v, %v", o, st)
	}
	e.clock.Advance(ttl - time.Millisecond)
	if !e.overrideIs(a, 7) {
		t.Fatal("the cached override was dropped before the TTL")
	}
	e.clock.Advance(time.Millisecond)
	if !e.overrideIs(a, 8) {
		o, st := e.d.Overrides(a)
		t.Fatalf("after the TTL: %v, %v; want upload 8/1s", o, st)
	}

	// InvalidateOverrides drops one tenant's entry at once.
	e.setLimits(a, uploadLimit(10), false)
	e.d.InvalidateOverrides(a)
	if !e.overrideIs(a, 10) {
		t.Error("InvalidateOverrides did not drop the cached override")
	}
	if n := e.rec.dbErrors(); n != 0 {
		t.Errorf("%d database errors", n)
	}
}

// listenerPID returns the backend of the directory's LISTEN connection, other than the
// ones in gone.
func (e *env) listenerPID(gone map[int]bool) int {
	e.t.Helper()
	var pid int
	waitFor(e.t, 5*time.Second, "the LISTEN backend in pg_stat_activity", func() bool {
		rows, err := e.admin.Query(e.t.Context(), `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'`)
		if err != nil {
			e.t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var p int
			if err := rows.Scan(&p); err != nil {
				e.t.Fatal(err)
			}
			if !gone[p] {
				pid = p
				return true
			}
		}
		return false
	})
	return pid
}

func TestListenReconnects(t *testing.T) {
	e := newEnv(t, "", Options{})
	a := e.addTenant(newKey("ck_"))
	b := e.addTenant(newKey("ck_"))
	e.listen()
	waitFor(t, 10*time.Second, "Listening", e.d.Listening)
	if o, st := e.d.Overrides(a); st != Found || len(o) != 0 {
		t.Fatalf("Overrides(a) = %v, %v", o, st)
	}
	e.setLimits(a, uploadLimit(3), false) // a change whose notification is "missed"

	gone := map[int]bool{}
	// Several interruptions in a row: each is a new one and reconnects after the first,
	// short delay, not after a delay grown by the earlier ones.
	for i := range 5 {
		pid := e.listenerPID(gone)
		gone[pid] = true
		start := time.Now()
		if n := e.queryInt(`SELECT count(*) FROM (SELECT pg_terminate_backend($1)) t`, pid); n != 1 {
			t.Fatal("pg_terminate_backend")
		}
		waitFor(t, 5*time.Second, "Listening to go false", func() bool { return !e.d.Listening() })
		waitFor(t, 10*time.Second, "Listening to come back", e.d.Listening)
		if took := time.Since(start); took > time.Second {
			t.Errorf("interruption %d: listening again after %v, want under 1 s", i+1, took)
		}
		if i == 0 && !e.overrideIs(a, 3) {
			// Notifications may have been missed while disconnected: every cached
			// override is dropped on reconnecting.
			t.Error("the cached override survived a reconnection")
		}
	}
	if n := e.rec.dbError("listen"); n < 5 {
		t.Errorf("%d listen errors counted, want at least 5", n)
	}
	if n := e.logs.count(listenWarning); n != 5 {
		t.Errorf("%d warnings for 5 interruptions, want one each:\n%s", n, e.logs)
	}

	// Notifications still work on the new connection.
	if o, st := e.d.Overrides(b); st != Found || len(o) != 0 {
		t.Fatalf("Overrides(b) = %v, %v", o, st)
	}
	e.setLimits(b, uploadLimit(4), true)
	waitFor(t, 5*time.Second, "a notification after reconnecting", func() bool { return e.overrideIs(b, 4) })
}

// A change of a tenant or of one of its channels (announced on tenant_changes by the
// core's trigger, whatever makes it) drops that tenant's cached credentials at once,
// without the credential TTL passing; other tenants' stay cached.
func TestTenantChangesDropCredentialsAtOnce(t *testing.T) {
	e := newEnv(t, "", Options{CredentialTTL: 30 * time.Second})
	keyA, keyB := newKey("cvg_live_"), newKey("cvg_live_")
	a, b := e.addTenant(keyA), e.addTenant(keyB)
	secretA, pubA, secretB := newKey("s_"), newKey("cvg_pk_"), newKey("s_")
	chA, chB := e.addChannel(a, secretA, pubA), e.addChannel(b, secretB, "")
	e.listen()
	waitFor(t, 10*time.Second, "Listening", e.d.Listening)

	active := func() (bool, bool, bool, bool, bool) {
		ta, _ := e.d.TenantByAPIKey(keyA)
		ca, _ := e.d.ChannelBySecret(secretA)
		pa, _ := e.d.ChannelByPublishableKey(pubA)
		tb, _ := e.d.TenantByAPIKey(keyB)
		cb, _ := e.d.ChannelBySecret(secretB)
		return ta.Active, ca.Active, pa.Active, tb.Active, cb.Active
	}
	if ta, ca, pa, tb, cb := active(); !ta || !ca || !pa || !tb || !cb {
		t.Fatalf("before: %v %v %v %v %v", ta, ca, pa, tb, cb)
	}
	if ten, _ := e.d.ChannelTenant(chA); ten != a {
		t.Fatalf("ChannelTenant(a's channel) = %q", ten)
	}
	missesB := e.rec.count("api_keys", ResultMiss)

	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, a)
	waitFor(t, 5*time.Second, "a's key refused", func() bool { ta, _, _, _, _ := active(); return !ta })
	if ta, ca, pa, tb, cb := active(); ta || ca || pa || !tb || !cb {
		t.Fatalf("after a's deactivation: %v %v %v %v %v", ta, ca, pa, tb, cb)
	}
	if n := e.rec.count("api_keys", ResultMiss) - missesB; n < 1 {
		t.Fatalf("a's key was not looked up again (%d misses)", n)
	}

	// A channel: its tenant's entries go, the channel is inactive at once.
	e.exec(`UPDATE tenants SET status = 'active' WHERE id = $1`, a)
	waitFor(t, 5*time.Second, "a's key accepted again", func() bool { ta, _, _, _, _ := active(); return ta })
	e.exec(`UPDATE channels SET status = 'inactive' WHERE id = $1`, chB)
	waitFor(t, 5*time.Second, "b's channel refused", func() bool { _, _, _, _, cb := active(); return !cb })
	if ta, ca, pa, tb, _ := active(); !ta || !ca || !pa || !tb {
		t.Fatalf("after b's channel's deactivation: %v %v %v %v", ta, ca, pa, tb)
	}

	// A rotation with no grace: the old key stops at once.
	e.exec(`UPDATE tenants SET api_key_hash = $2 WHERE id = $1`, b, hash(newKey("cvg_live_")))
	waitFor(t, 5*time.Second, "b's replaced key refused", func() bool {
		_, st := e.d.TenantByAPIKey(keyB)
		return st == NotFound
	})
	if n := e.rec.dbErrors(); n != 0 {
		t.Errorf("%d database errors", n)
	}
}

// After a reconnection (notifications may have been missed) every cached credential is
// reloaded in the background at its next lookup, which still answers at once.
func TestListenReconnectRefreshesCredentials(t *testing.T) {
	e := newEnv(t, "", Options{CredentialTTL: 30 * time.Second})
	key := newKey("cvg_live_")
	a := e.addTenant(key)
	e.listen()
	waitFor(t, 10*time.Second, "Listening", e.d.Listening)
	if ta, st := e.d.TenantByAPIKey(key); st != Found || !ta.Active {
		t.Fatalf("before: %+v %v", ta, st)
	}
	// A change that nobody hears of (the trigger is off for it): the cached value stays.
	e.exec(`ALTER TABLE tenants DISABLE TRIGGER tenants_notify_change`)
	e.exec(`UPDATE tenants SET status = 'inactive' WHERE id = $1`, a)
	e.exec(`ALTER TABLE tenants ENABLE TRIGGER tenants_notify_change`)
	time.Sleep(100 * time.Millisecond)
	if ta, st := e.d.TenantByAPIKey(key); st != Found || !ta.Active {
		t.Fatalf("without a notification the cached value changed: %+v %v", ta, st)
	}
	pid := e.listenerPID(nil)
	e.queryInt(`SELECT count(*) FROM (SELECT pg_terminate_backend($1)) t`, pid)
	waitFor(t, 5*time.Second, "Listening to go false", func() bool { return !e.d.Listening() })
	waitFor(t, 10*time.Second, "Listening to come back", e.d.Listening)
	waitFor(t, 5*time.Second, "the change missed while disconnected", func() bool {
		ta, st := e.d.TenantByAPIKey(key)
		return st == Found && !ta.Active
	})
}
