package store

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/converger/edge/shared/ids"
)

// The kinds of users that sign in: admins (the admin pages) and tenant users (the
// portal). They name the user in sessions, password_resets and recovery_codes.
const (
	KindAdmin  = "admin"
	KindTenant = "tenant"
)

// The stages of a session.
const (
	// SessionTOTP: the password was right and the TOTP code is due; the session grants
	// nothing but the TOTP step.
	SessionTOTP = "totp"
	// SessionSignedIn: a full session.
	SessionSignedIn = "signed_in"
)

// usersTable returns the table of a user kind.
func usersTable(kind string) (string, bool) {
	switch kind {
	case KindAdmin:
		return "admin_users", true
	case KindTenant:
		return "tenant_users", true
	}
	return "", false
}

// LoginUser is an admin or a tenant user as the login pages see it.
type LoginUser struct {
	Kind  string // KindAdmin or KindTenant
	ID    string
	Email string
	// TenantID and TenantName are a tenant user's tenant ("" for admins).
	TenantID, TenantName string
	PasswordHash         string
	// Active: the user, and a tenant user's tenant, are active.
	Active             bool
	MustChangePassword bool
	// TOTPSecret is the TOTP secret sealed with ENCRYPTION_KEY; nil while two-factor
	// authentication is off.
	TOTPSecret []byte
}

// TOTPEnabled reports whether the user signs in with a TOTP code too.
func (u LoginUser) TOTPEnabled() bool { return u.TOTPSecret != nil }

const (
	adminLoginColumns = `u.id::text, u.email, '', '', u.password_hash, u.status = 'active',
		u.must_change_password, u.totp_secret`
	tenantLoginColumns = `u.id::text, u.email, t.id::text, t.name, u.password_hash,
		u.status = 'active' AND t.status = 'active', u.must_change_password, u.totp_secret`
)

func scanLoginUser(kind string, row pgx.Row) (LoginUser, error) {
	u := LoginUser{Kind: kind}
	err := row.Scan(&u.ID, &u.Email, &u.TenantID, &u.TenantName, &u.PasswordHash, &u.Active,
		&u.MustChangePassword, &u.TOTPSecret)
	return u, notFound(err)
}

// AdminForLogin returns the admin with that email, compared case-insensitively.
func (s *Store) AdminForLogin(ctx context.Context, email string) (LoginUser, error) {
	return scanLoginUser(KindAdmin, s.pool.QueryRow(ctx, `SELECT `+adminLoginColumns+`
		FROM admin_users u WHERE lower(u.email) = lower($1)`, email))
}

// TenantUserForLogin returns the user with that email of the tenant with that name, both
// compared case-insensitively.
func (s *Store) TenantUserForLogin(ctx context.Context, tenantName, email string) (LoginUser, error) {
	return scanLoginUser(KindTenant, s.pool.QueryRow(ctx, `SELECT `+tenantLoginColumns+`
		FROM tenant_users u JOIN tenants t ON t.id = u.tenant_id
		WHERE lower(t.name) = lower($1) AND lower(u.email) = lower($2)`, tenantName, email))
}

// LoginUserByID returns a user by kind and id.
func (s *Store) LoginUserByID(ctx context.Context, kind, id string) (LoginUser, error) {
	if !ids.IsUUID(id) {
		return LoginUser{}, ErrNotFound
	}
	switch kind {
	case KindAdmin:
		return scanLoginUser(kind, s.pool.QueryRow(ctx, `SELECT `+adminLoginColumns+`
			FROM admin_users u WHERE u.id = $1`, id))
	case KindTenant:
		return scanLoginUser(kind, s.pool.QueryRow(ctx, `SELECT `+tenantLoginColumns+`
			FROM tenant_users u JOIN tenants t ON t.id = u.tenant_id WHERE u.id = $1`, id))
	}
	return LoginUser{}, ErrNotFound
}

// Session is a server-side session of the login pages. The cookie holds a random id;
// the table only its SHA-256 (IDHash).
type Session struct {
	IDHash       []byte
	Kind, UserID string
	Stage        string // SessionTOTP or SessionSignedIn
	CreatedAt    time.Time
	LastSeenAt   time.Time
	ExpiresAt    time.Time
	// TOTPPending is the sealed otpauth URI of an enrolment awaiting its first code.
	TOTPPending []byte
}

// CreateSession stores a new session (created and last seen at CreatedAt) and drops the
// user's sessions that had expired by then.
func (s *Store) CreateSession(ctx context.Context, sess Session) error {
	if _, ok := usersTable(sess.Kind); !ok || !ids.IsUUID(sess.UserID) {
		return invalidf("a session needs a user kind and id")
	}
	return s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM sessions WHERE user_kind = $1 AND user_id = $2 AND expires_at <= $3`,
			sess.Kind, sess.UserID, sess.CreatedAt); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO sessions (id_hash, user_kind, user_id, stage, created_at, last_seen_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $5, $6)`,
			sess.IDHash, sess.Kind, sess.UserID, sess.Stage, sess.CreatedAt, sess.ExpiresAt)
		return err
	})
}

// TouchSession returns the session with that id hash if it has neither expired nor been
// idle for idle or longer at now, and records now as its last use. A session past
// either limit is deleted and ErrNotFound.
func (s *Store) TouchSession(ctx context.Context, idHash []byte, now time.Time, idle time.Duration) (Session, error) {
	sess := Session{IDHash: idHash}
	err := s.pool.QueryRow(ctx, `
		UPDATE sessions SET last_seen_at = $2
		WHERE id_hash = $1 AND expires_at > $2 AND last_seen_at > $2 - $3::bigint * interval '1 microsecond'
		RETURNING user_kind, user_id::text, stage, created_at, last_seen_at, expires_at, totp_pending`,
		idHash, now, idle.Microseconds()).Scan(&sess.Kind, &sess.UserID, &sess.Stage, &sess.CreatedAt,
		&sess.LastSeenAt, &sess.ExpiresAt, &sess.TOTPPending)
	if errors.Is(err, pgx.ErrNoRows) {
		if _, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE id_hash = $1`, idHash); err != nil {
			return Session{}, err
		}
		return Session{}, ErrNotFound
	}
	return sess, err
}

// PurgeLogins deletes what can no longer be used at now: sessions past their absolute
// expiry or idle for idle or longer, and password reset tokens past their expiry (used
// ones included). It returns how many of each it deleted.
func (s *Store) PurgeLogins(ctx context.Context, now time.Time, idle time.Duration) (sessions, resets int64, err error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM sessions
		WHERE expires_at <= $1 OR last_seen_at <= $1 - $2::bigint * interval '1 microsecond'`, now, idle.Microseconds())
	if err != nil {
		return 0, 0, err
	}
	sessions = tag.RowsAffected()
	tag, err = s.pool.Exec(ctx, `DELETE FROM password_resets WHERE expires_at <= $1`, now)
	if err != nil {
		return sessions, 0, err
	}
	return sessions, tag.RowsAffected(), nil
}

// DeleteSession deletes a session (logout). A missing one is no error.
func (s *Store) DeleteSession(ctx context.Context, idHash []byte) error {
	_, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE id_hash = $1`, idHash)
	return err
}

// SetTOTPPending keeps the sealed otpauth URI of a TOTP enrolment in the session (nil
// clears it).
func (s *Store) SetTOTPPending(ctx context.Context, idHash, sealed []byte) error {
	_, err := s.pool.Exec(ctx, `UPDATE sessions SET totp_pending = $2 WHERE id_hash = $1`, idHash, sealed)
	return err
}

// AcceptTOTPStep records step as the user's last accepted TOTP step if it is later than
// the one recorded, and reports whether it was: a code of an earlier or the same step
// is a reused code. Concurrent callers with the same step see one true.
func (s *Store) AcceptTOTPStep(ctx context.Context, kind, id string, step int64) (bool, error) {
	table, ok := usersTable(kind)
	if !ok || !ids.IsUUID(id) {
		return false, ErrNotFound
	}
	tag, err := s.pool.Exec(ctx, `UPDATE `+table+` SET totp_last_step = $2
		WHERE id = $1 AND totp_secret IS NOT NULL AND (totp_last_step IS NULL OR totp_last_step < $2)`, id, step)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// EnableTOTP turns on two-factor authentication for a user whose TOTP is off: the sealed
// secret, the step of the code that confirmed it (so that code cannot be used again)
// and the hashes of the new recovery codes, which replace any earlier ones. A user whose
// TOTP is on already is ErrConflict.
func (s *Store) EnableTOTP(ctx context.Context, kind, id string, sealedSecret []byte, step int64, codeHashes [][]byte) error {
	table, ok := usersTable(kind)
	if !ok || !ids.IsUUID(id) {
		return ErrNotFound
	}
	return s.inTx(ctx, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE `+table+` SET totp_secret = $2, totp_last_step = $3, updated_at = now()
			WHERE id = $1 AND totp_secret IS NULL`, id, sealedSecret, step)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return ErrConflict
		}
		if _, err := tx.Exec(ctx, `DELETE FROM recovery_codes WHERE user_kind = $1 AND user_id = $2`, kind, id); err != nil {
			return err
		}
		for _, h := range codeHashes {
			if _, err := tx.Exec(ctx, `INSERT INTO recovery_codes (user_kind, user_id, code_hash) VALUES ($1, $2, $3)`,
				kind, id, h); err != nil {
				return err
			}
		}
		return audit(ctx, tx, kind+":"+id, "users.totp_enable", kind+"_user:"+id,
			map[string]any{"recovery_codes": len(codeHashes)})
	})
}

// UseRecoveryCode marks the user's unused recovery code with that hash used at now, and
// reports whether there was one.
func (s *Store) UseRecoveryCode(ctx context.Context, kind, id string, codeHash []byte, now time.Time) (bool, error) {
	if _, ok := usersTable(kind); !ok || !ids.IsUUID(id) {
		return false, ErrNotFound
	}
	tag, err := s.pool.Exec(ctx, `UPDATE recovery_codes SET used_at = $4
		WHERE user_kind = $1 AND user_id = $2 AND code_hash = $3 AND used_at IS NULL`, kind, id, codeHash, now)
	if err != nil {
		return false, err
	}
	return tag.RowsAffected() == 1, nil
}

// UnusedRecoveryCodes counts the user's recovery codes not used yet.
func (s *Store) UnusedRecoveryCodes(ctx context.Context, kind, id string) (int, error) {
	var n int
	err := s.pool.QueryRow(ctx, `SELECT count(*) FROM recovery_codes WHERE user_kind = $1 AND user_id = $2 AND used_at IS NULL`,
		kind, id).Scan(&n)
	return n, err
}

// ChangePassword sets a user's password hash, clears must_change_password, revokes the
// user's other sessions (all but keepSession) and outstanding password resets.
func (s *Store) ChangePassword(ctx context.Context, kind, id, passwordHash string, keepSession []byte, now time.Time) error {
	table, ok := usersTable(kind)
	if !ok || !ids.IsUUID(id) {
		return ErrNotFound
	}
	return s.inTx(ctx, func(tx pgx.Tx) error {
		if err := setPassword(ctx, tx, table, kind, id, passwordHash, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM sessions WHERE user_kind = $1 AND user_id = $2 AND ($3::bytea IS NULL OR id_hash <> $3)`,
			kind, id, keepSession); err != nil {
			return err
		}
		return audit(ctx, tx, kind+":"+id, "users.password_change", kind+"_user:"+id, nil)
	})
}

// setPassword writes the hash, clears must_change_password and uses up the user's
// outstanding password resets.
func setPassword(ctx context.Context, tx pgx.Tx, table, kind, id, passwordHash string, now time.Time) error {
	if !strings.HasPrefix(passwordHash, "$") {
		return invalidf("the password hash is not in a known format")
	}
	tag, err := tx.Exec(ctx, `UPDATE `+table+` SET password_hash = $2, must_change_password = false, updated_at = now()
		WHERE id = $1`, id, passwordHash)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return ErrNotFound
	}
	_, err = tx.Exec(ctx, `UPDATE password_resets SET used_at = $3 WHERE user_kind = $1 AND user_id = $2 AND used_at IS NULL`,
		kind, id, now)
	return err
}

// CreatePasswordReset stores the hash of a password reset token of a user.
func (s *Store) CreatePasswordReset(ctx context.Context, kind, id string, tokenHash []byte, expiresAt time.Time) error {
	if _, ok := usersTable(kind); !ok || !ids.IsUUID(id) {
		return ErrNotFound
	}
	_, err := s.pool.Exec(ctx, `INSERT INTO password_resets (token_hash, user_kind, user_id, expires_at) VALUES ($1, $2, $3, $4)`,
		tokenHash, kind, id, expiresAt)
	return err
}

// PasswordResetUser returns the user of a password reset token of a user of that kind
// that is unused, has not expired at now, and whose user is active; else ErrNotFound.
func (s *Store) PasswordResetUser(ctx context.Context, tokenHash []byte, kind string, now time.Time) (LoginUser, error) {
	var id string
	err := s.pool.QueryRow(ctx, `SELECT user_id::text FROM password_resets
		WHERE token_hash = $1 AND user_kind = $2 AND used_at IS NULL AND expires_at > $3`, tokenHash, kind, now).Scan(&id)
	if err != nil {
		return LoginUser{}, notFound(err)
	}
	u, err := s.LoginUserByID(ctx, kind, id)
	if err == nil && !u.Active {
		return LoginUser{}, ErrNotFound
	}
	return u, err
}

// ResetPassword uses a password reset token of a user of that kind: if it is unused and
// has not expired at now, and its user is active, the token is marked used, the password
// hash set, must_change_password cleared, and every session and other reset of the user
// revoked, in one transaction. Otherwise ErrNotFound and nothing changes.
func (s *Store) ResetPassword(ctx context.Context, tokenHash []byte, kind string, now time.Time, passwordHash string) (LoginUser, error) {
	var u LoginUser
	err := s.inTx(ctx, func(tx pgx.Tx) error {
		var id string
		err := tx.QueryRow(ctx, `UPDATE password_resets SET used_at = $3
			WHERE token_hash = $1 AND user_kind = $2 AND used_at IS NULL AND expires_at > $3
			RETURNING user_id::text`, tokenHash, kind, now).Scan(&id)
		if err != nil {
			return notFound(err)
		}
		table, ok := usersTable(kind)
		if !ok {
			return ErrNotFound
		}
		q := `SELECT ` + adminLoginColumns + ` FROM admin_users u WHERE u.id = $1 FOR UPDATE`
		if kind == KindTenant {
			q = `SELECT ` + tenantLoginColumns + ` FROM tenant_users u JOIN tenants t ON t.id = u.tenant_id
				WHERE u.id = $1 FOR UPDATE OF u`
		}
		if u, err = scanLoginUser(kind, tx.QueryRow(ctx, q, id)); err != nil {
			return err
		}
		if !u.Active {
			return ErrNotFound
		}
		if err := setPassword(ctx, tx, table, kind, id, passwordHash, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `DELETE FROM sessions WHERE user_kind = $1 AND user_id = $2`, kind, id); err != nil {
			return err
		}
		return audit(ctx, tx, kind+":"+id, "users.password_reset", kind+"_user:"+id, nil)
	})
	if err != nil {
		return LoginUser{}, err
	}
	u.MustChangePassword = false
	return u, nil
}

// bootstrapLock is the advisory lock key under which cores starting at once decide
// whether the first admin is still to be created.
const bootstrapLock = 0x636f6e7665726772 // "convergr"

// CreateFirstAdmin creates an admin user when there is none yet, and reports whether it
// did; with an admin present it changes nothing. Cores starting together take turns on
// an advisory lock, so at most one first admin is created.
func (o *Operator) CreateFirstAdmin(ctx context.Context, email, passwordHash string, mustChangePassword bool) (AdminUser, bool, error) {
	if err := CheckEmail(email); err != nil {
		return AdminUser{}, false, err
	}
	if !strings.HasPrefix(passwordHash, "$") {
		return AdminUser{}, false, invalidf("the password hash is not in a known format")
	}
	var u AdminUser
	created := false
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(bootstrapLock)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM admin_users)`).Scan(&exists); err != nil || exists {
			return err
		}
		err := tx.QueryRow(ctx, `
			INSERT INTO admin_users (email, password_hash, must_change_password) VALUES ($1, $2, $3)
			RETURNING id::text, email, role, status, must_change_password`,
			email, passwordHash, mustChangePassword).Scan(&u.ID, &u.Email, &u.Role, &u.Status, &u.MustChangePassword)
		if err != nil {
			return err
		}
		created = true
		return o.audit(ctx, tx, "admins.bootstrap", "admin_user:"+u.ID, map[string]any{
			"after": map[string]any{"email": u.Email, "role": u.Role, "status": u.Status,
				"must_change_password": u.MustChangePassword},
		})
	})
	if err != nil {
		return AdminUser{}, false, err
	}
	return u, created, nil
}

// TenantUser is a user of the tenant portal.
type TenantUser struct {
	ID, TenantID, Email, Role, Status string
	MustChangePassword                bool
}

// CreateTenantUser creates a portal user of a tenant with a password hash made by
// core/passwords. An email the tenant's users already have, in any case, is ErrConflict.
func (o *Operator) CreateTenantUser(ctx context.Context, tenantID, email, passwordHash string, mustChangePassword bool) (TenantUser, error) {
	if err := CheckEmail(email); err != nil {
		return TenantUser{}, err
	}
	if !strings.HasPrefix(passwordHash, "$") {
		return TenantUser{}, invalidf("the password hash is not in a known format")
	}
	if !ids.IsUUID(tenantID) {
		return TenantUser{}, ErrNotFound
	}
	var u TenantUser
	err := o.s.inTx(ctx, func(tx pgx.Tx) error {
		var id string
		if err := tx.QueryRow(ctx, `SELECT id::text FROM tenants WHERE id = $1 FOR SHARE`, tenantID).Scan(&id); err != nil {
			return notFound(err)
		}
		err := tx.QueryRow(ctx, `
			INSERT INTO tenant_users (tenant_id, email, password_hash, must_change_password) VALUES ($1, $2, $3, $4)
			RETURNING id::text, tenant_id::text, email, role, status, must_change_password`,
			tenantID, email, passwordHash, mustChangePassword).Scan(&u.ID, &u.TenantID, &u.Email, &u.Role, &u.Status,
			&u.MustChangePassword)
		if isUniqueViolation(err) {
			return ErrConflict
		}
		if err != nil {
			return err
		}
		return o.audit(ctx, tx, "tenant_users.create", "tenant_user:"+u.ID, map[string]any{
			"after": map[string]any{"tenant_id": u.TenantID, "email": u.Email, "role": u.Role, "status": u.Status,
				"must_change_password": u.MustChangePassword},
		})
	})
	if err != nil {
		return TenantUser{}, err
	}
	return u, nil
}
