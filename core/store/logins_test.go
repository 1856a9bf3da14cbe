package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/store"
)

const testHash = "$argon2id$v=19$m=64,t=1,p=1$c2FsdHNhbHRzYWx0$aGFzaGhhc2hoYXNoaGFzaA"

func (e *manageEnv) adminUser(email string) store.AdminUser {
	e.t.Helper()
	u, err := e.op.CreateAdminUser(e.ctx, email, testHash, false)
	if err != nil {
		e.t.Fatal(err)
	}
	return u
}

func (e *manageEnv) countSessions(kind, id string) int {
	e.t.Helper()
	var n int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM sessions WHERE user_kind = $1 AND user_id = $2`, kind, id).Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *manageEnv) session(kind, id string, now time.Time, life time.Duration) []byte {
	e.t.Helper()
	h := credentials.Hash(credentials.Random(32))
	if err := e.st.CreateSession(e.ctx, store.Session{IDHash: h, Kind: kind, UserID: id, Stage: store.SessionSignedIn,
		CreatedAt: now, ExpiresAt: now.Add(life)}); err != nil {
		e.t.Fatal(err)
	}
	return h
}

func TestSessionsIdleAndAbsoluteExpiry(t *testing.T) {
	e := newManageEnv(t)
	u := e.adminUser("s1@example.com")
	t0 := time.Now().Truncate(time.Second)
	h := e.session(store.KindAdmin, u.ID, t0, time.Hour)

	s, err := e.st.TouchSession(e.ctx, h, t0.Add(29*time.Minute), 30*time.Minute)
	if err != nil || s.UserID != u.ID || s.Kind != store.KindAdmin || s.Stage != store.SessionSignedIn ||
		!s.LastSeenAt.Equal(t0.Add(29*time.Minute)) {
		t.Fatalf("touch within the idle time: %+v %v", s, err)
	}
	if _, err := e.st.TouchSession(e.ctx, h, t0.Add(58*time.Minute), 30*time.Minute); err != nil {
		t.Fatalf("touch 29 min after the last use: %v", err)
	}
	if _, err := e.st.TouchSession(e.ctx, h, t0.Add(61*time.Minute), 30*time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch past the absolute expiry: %v", err)
	}
	if n := e.countSessions(store.KindAdmin, u.ID); n != 0 {
		t.Fatalf("%d sessions left, want the expired one deleted", n)
	}

	h = e.session(store.KindAdmin, u.ID, t0, time.Hour)
	if _, err := e.st.TouchSession(e.ctx, h, t0.Add(30*time.Minute), 30*time.Minute); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("touch after 30 min idle: %v", err)
	}

	// A new session drops the user's expired ones.
	e.session(store.KindAdmin, u.ID, t0, time.Minute)
	e.session(store.KindAdmin, u.ID, t0.Add(2*time.Minute), time.Hour)
	if n := e.countSessions(store.KindAdmin, u.ID); n != 1 {
		t.Fatalf("%d sessions, want the expired one dropped", n)
	}
	if err := e.st.CreateSession(e.ctx, store.Session{IDHash: h, Kind: "robot", UserID: u.ID}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("a session of an unknown kind: %v", err)
	}
}

func TestTOTPStepsAndRecoveryCodes(t *testing.T) {
	e := newManageEnv(t)
	u := e.adminUser("t1@example.com")
	if ok, err := e.st.AcceptTOTPStep(e.ctx, store.KindAdmin, u.ID, 5); ok || err != nil {
		t.Fatalf("a step for a user without TOTP: %v %v", ok, err)
	}
	codes := [][]byte{credentials.Hash("a"), credentials.Hash("b")}
	if err := e.st.EnableTOTP(e.ctx, store.KindAdmin, u.ID, []byte("sealed"), 10, codes); err != nil {
		t.Fatal(err)
	}
	if err := e.st.EnableTOTP(e.ctx, store.KindAdmin, u.ID, []byte("sealed"), 10, codes); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("enabling twice: %v", err)
	}
	lu, err := e.st.LoginUserByID(e.ctx, store.KindAdmin, u.ID)
	if err != nil || !lu.TOTPEnabled() || string(lu.TOTPSecret) != "sealed" {
		t.Fatalf("%+v %v", lu, err)
	}
	for _, c := range []struct {
		step int64
		want bool
	}{{10, false}, {9, false}, {11, true}, {11, false}, {13, true}, {12, false}} {
		if ok, err := e.st.AcceptTOTPStep(e.ctx, store.KindAdmin, u.ID, c.step); ok != c.want || err != nil {
			t.Fatalf("step %d: %v %v, want %v", c.step, ok, err, c.want)
		}
	}
	// Concurrent uses of one code: one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	accepted := 0
	for range 10 {
		wg.Go(func() {
			ok, err := e.st.AcceptTOTPStep(e.ctx, store.KindAdmin, u.ID, 14)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				accepted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if accepted != 1 {
		t.Fatalf("a code accepted %d times concurrently", accepted)
	}

	now := time.Now()
	for i, want := range []bool{true, false} {
		if ok, err := e.st.UseRecoveryCode(e.ctx, store.KindAdmin, u.ID, codes[0], now); ok != want || err != nil {
			t.Fatalf("use %d of a recovery code: %v %v", i+1, ok, err)
		}
	}
	other := e.adminUser("t2@example.com")
	if ok, _ := e.st.UseRecoveryCode(e.ctx, store.KindAdmin, other.ID, codes[1], now); ok {
		t.Fatal("another user's recovery code was accepted")
	}
	if n, err := e.st.UnusedRecoveryCodes(e.ctx, store.KindAdmin, u.ID); n != 1 || err != nil {
		t.Fatalf("%d unused codes (%v)", n, err)
	}
}

func TestPasswordResets(t *testing.T) {
	e := newManageEnv(t)
	u := e.adminUser("r1@example.com")
	now := time.Now().Truncate(time.Second)
	token := credentials.Hash("token-1")
	if err := e.st.CreatePasswordReset(e.ctx, store.KindAdmin, u.ID, token, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	other := credentials.Hash("token-2")
	if err := e.st.CreatePasswordReset(e.ctx, store.KindAdmin, u.ID, other, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	e.session(store.KindAdmin, u.ID, now, time.Hour)
	e.session(store.KindAdmin, u.ID, now, time.Hour)

	if _, err := e.st.PasswordResetUser(e.ctx, token, store.KindTenant, now); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an admin's token as a tenant user's: %v", err)
	}
	if _, err := e.st.PasswordResetUser(e.ctx, token, store.KindAdmin, now.Add(time.Hour)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an expired token: %v", err)
	}
	if _, err := e.st.ResetPassword(e.ctx, token, store.KindAdmin, now.Add(time.Hour), testHash); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("resetting with an expired token: %v", err)
	}
	got, err := e.st.PasswordResetUser(e.ctx, token, store.KindAdmin, now)
	if err != nil || got.ID != u.ID {
		t.Fatalf("%+v %v", got, err)
	}
	newHash := "$argon2id$v=19$m=64,t=1,p=1$bmV3c2FsdG5ld3NhbHQ$bmV3aGFzaG5ld2hhc2huZXdoYQ"
	if _, err := e.st.ResetPassword(e.ctx, token, store.KindAdmin, now, newHash); err != nil {
		t.Fatal(err)
	}
	lu, _ := e.st.LoginUserByID(e.ctx, store.KindAdmin, u.ID)
	if lu.PasswordHash != newHash || lu.MustChangePassword {
		t.Fatalf("after the reset: %+v", lu)
	}
	if n := e.countSessions(store.KindAdmin, u.ID); n != 0 {
		t.Fatalf("%d sessions after the reset, want none", n)
	}
	for _, tok := range [][]byte{token, other} {
		if _, err := e.st.ResetPassword(e.ctx, tok, store.KindAdmin, now, testHash); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a used or superseded token: %v", err)
		}
	}

	// A deactivated user's token does nothing and stays unused.
	if _, err := e.pool.Exec(e.ctx, `UPDATE admin_users SET status = 'inactive' WHERE id = $1`, u.ID); err != nil {
		t.Fatal(err)
	}
	third := credentials.Hash("token-3")
	if err := e.st.CreatePasswordReset(e.ctx, store.KindAdmin, u.ID, third, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.st.ResetPassword(e.ctx, third, store.KindAdmin, now, testHash); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a deactivated user's reset: %v", err)
	}
	var used bool
	if err := e.pool.QueryRow(e.ctx, `SELECT used_at IS NOT NULL FROM password_resets WHERE token_hash = $1`, third).Scan(&used); err != nil || used {
		t.Fatalf("the deactivated user's token was used up: %v %v", used, err)
	}

	// ChangePassword keeps the current session only.
	v := e.adminUser("r2@example.com")
	keep := e.session(store.KindAdmin, v.ID, now, time.Hour)
	e.session(store.KindAdmin, v.ID, now, time.Hour)
	if err := e.st.ChangePassword(e.ctx, store.KindAdmin, v.ID, newHash, keep, now); err != nil {
		t.Fatal(err)
	}
	if n := e.countSessions(store.KindAdmin, v.ID); n != 1 {
		t.Fatalf("%d sessions after a password change, want the current one", n)
	}
	if _, err := e.st.TouchSession(e.ctx, keep, now, time.Hour); err != nil {
		t.Fatalf("the current session: %v", err)
	}
}

// Cores starting together create one first admin.
func TestCreateFirstAdmin(t *testing.T) {
	e := newManageEnv(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	for i := range 6 {
		wg.Go(func() {
			_, ok, err := e.op.CreateFirstAdmin(context.Background(), fmt.Sprintf("first%d@example.com", i), testHash, true)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				created++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var n int
	if err := e.pool.QueryRow(e.ctx, `SELECT count(*) FROM admin_users`).Scan(&n); err != nil || n != 1 || created != 1 {
		t.Fatalf("%d admins, %d reported created (%v)", n, created, err)
	}
	bootstraps := 0
	for _, a := range e.audits("") {
		if a.Action == "admins.bootstrap" {
			bootstraps++
		}
	}
	if bootstraps != 1 {
		t.Fatalf("%d audit entries of the bootstrap", bootstraps)
	}
}

func TestCreateTenantUser(t *testing.T) {
	e := newManageEnv(t)
	ten, _ := e.tenant("Acme")
	u, err := e.op.CreateTenantUser(e.ctx, ten.ID, "Ann@example.com", testHash, false)
	if err != nil || u.TenantID != ten.ID || u.Status != "active" {
		t.Fatalf("%+v %v", u, err)
	}
	if _, err := e.op.CreateTenantUser(e.ctx, ten.ID, "ann@EXAMPLE.com", testHash, false); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("the same email in another case: %v", err)
	}
	other, _ := e.tenant("Other")
	if _, err := e.op.CreateTenantUser(e.ctx, other.ID, "ann@example.com", testHash, false); err != nil {
		t.Fatalf("the same email at another tenant: %v", err)
	}
	if _, err := e.op.CreateTenantUser(e.ctx, "6f1c2a52-4f7e-4b8e-9a51-0d6b0c3c1a10", "x@example.com", testHash, false); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown tenant: %v", err)
	}
	lu, err := e.st.TenantUserForLogin(e.ctx, "ACME", "ANN@example.com")
	if err != nil || lu.ID != u.ID || lu.TenantName != "Acme" || !lu.Active || lu.Kind != store.KindTenant {
		t.Fatalf("%+v %v", lu, err)
	}
	if _, err := e.st.TenantUserForLogin(e.ctx, "Other", "nobody@example.com"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("an unknown user: %v", err)
	}
}

func TestPurgeLogins(t *testing.T) {
	e := newManageEnv(t)
	u := e.adminUser("purge@example.com")
	t0 := time.Now().Truncate(time.Second)
	expired := e.session(store.KindAdmin, u.ID, t0, time.Minute)
	idle := e.session(store.KindAdmin, u.ID, t0, 2*time.Hour)
	live := e.session(store.KindAdmin, u.ID, t0, 2*time.Hour)
	now := t0.Add(40 * time.Minute)
	if _, err := e.st.TouchSession(e.ctx, live, t0.Add(29*time.Minute), 30*time.Minute); err != nil {
		t.Fatal(err)
	}
	for i, exp := range []time.Time{t0.Add(10 * time.Minute), now.Add(time.Hour)} {
		if err := e.st.CreatePasswordReset(e.ctx, store.KindAdmin, u.ID, credentials.Hash(fmt.Sprint("reset-", i)), exp); err != nil {
			t.Fatal(err)
		}
	}

	sessions, resets, err := e.st.PurgeLogins(e.ctx, now, 30*time.Minute)
	if err != nil || sessions != 2 || resets != 1 {
		t.Fatalf("purged %d sessions and %d resets (%v), want 2 and 1", sessions, resets, err)
	}
	if n := e.countSessions(store.KindAdmin, u.ID); n != 1 {
		t.Fatalf("%d sessions left, want the live one", n)
	}
	for _, h := range [][]byte{expired, idle} {
		if _, err := e.st.TouchSession(e.ctx, h, t0, 30*time.Minute); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a purged session is still there: %v", err)
		}
	}
	if _, err := e.st.TouchSession(e.ctx, live, now, 30*time.Minute); err != nil {
		t.Fatalf("the live session was purged: %v", err)
	}
	if _, err := e.st.PasswordResetUser(e.ctx, credentials.Hash("reset-1"), store.KindAdmin, now); err != nil {
		t.Fatalf("the live reset token was purged: %v", err)
	}
	if sessions, resets, err := e.st.PurgeLogins(e.ctx, now, 30*time.Minute); err != nil || sessions != 0 || resets != 0 {
		t.Fatalf("a second purge deleted %d and %d (%v)", sessions, resets, err)
	}
}
