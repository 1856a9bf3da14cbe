package manage

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/ids"
)

// The admin API's tokens (the console's /admin/api/v1).

func registerAdminTokens() {
	register(&command{
		group: "admins", name: "token create", args: "--email E --scope read|write [--name N] [--expires-in 90d]",
		summary: "Makes an API token for the admin with that email, for the console's API (/admin/api/v1,\n" +
			"Authorization: Bearer <token>). read: GET only; write: everything the admin may do. The token is\n" +
			"printed once and stored as SHA-256; it stops when revoked, when it expires, or when the admin is\n" +
			"deactivated.",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.email, "email", "", "the admin's email address (required)")
			fs.StringVar(&r.o.scope, "scope", "", "read or write (required)")
			fs.StringVar(&r.o.name, "name", "", "what the token is for, shown in lists (default: api)")
			fs.StringVar(&r.o.expiresIn, "expires-in", "", "how long it works, e.g. 90d or 12h (default: until revoked; at most 366d)")
		},
		run: adminTokenCreate,
	})
	register(&command{
		group: "admins", name: "token revoke", args: "--id ID",
		summary: "Revokes an admin API token at once (its id is printed at creation and by `admins token list`).",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.id, "id", "", "the token's id (required)")
		},
		run: adminTokenRevoke,
	})
	register(&command{
		group: "admins", name: "token list", args: "--email E",
		summary: "Lists the API tokens of an admin (never the tokens themselves).",
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.email, "email", "", "the admin's email address (required)")
		},
		run: adminTokenList,
	})
}

// parseLifetime reads a Go duration or a whole number of days ("90d"); "" is 0.
func parseLifetime(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q is not a number of days such as 90d", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a duration such as 90d or 12h", s)
	}
	return d, nil
}

func (r *runner) admin(st *store.Store, email string) (store.AdminUser, error) {
	u, err := st.AdminByEmail(r.ctx, strings.TrimSpace(email))
	if errors.Is(err, store.ErrNotFound) {
		return u, failf("no admin with email %s", email)
	}
	return u, err
}

func adminTokenCreate(r *runner, _ []string) error {
	if err := r.required("email", r.o.email, "scope", r.o.scope); err != nil {
		return err
	}
	if r.o.scope != store.ScopeRead && r.o.scope != store.ScopeWrite {
		return r.usagef("--scope %q: must be read or write", r.o.scope)
	}
	ttl, err := parseLifetime(r.o.expiresIn)
	if err != nil {
		return r.usagef("--expires-in: %v", err)
	}
	if ttl > store.MaxAdminTokenTTL {
		return r.usagef("--expires-in: at most 366d")
	}
	name := r.o.name
	if name == "" {
		name = "api"
	}
	if err := store.CheckName("--name", name); err != nil {
		return r.usagef("%v", err)
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	u, err := r.admin(st, r.o.email)
	if err != nil {
		return err
	}
	t, secret, err := st.As(r.actor).CreateAdminToken(r.ctx, u.ID, name, r.o.scope, ttl)
	if err != nil {
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "Admin API token created.\n  id:      %s\n  admin:   %s\n  name:    %s\n  scope:   %s\n", t.ID, u.Email, t.Name, t.Scope)
	if t.ExpiresAt != nil {
		fmt.Fprintf(w, "  expires: %s\n", t.ExpiresAt.UTC().Format(time.RFC3339))
	} else {
		fmt.Fprintf(w, "  expires: never (until revoked)\n")
	}
	fmt.Fprintf(w, "  token:   %s\n", secret)
	fmt.Fprintf(w, "\nThe token is shown only this once: store it now. Send it as Authorization: Bearer <token>.\n")
	return nil
}

func adminTokenRevoke(r *runner, _ []string) error {
	if err := r.required("id", r.o.id); err != nil {
		return err
	}
	if !ids.IsUUID(r.o.id) {
		return r.usagef("--id %q: a token id is a UUID", r.o.id)
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	t, changed, err := st.As(r.actor).RevokeAdminToken(r.ctx, r.o.id)
	if errors.Is(err, store.ErrNotFound) {
		return failf("no admin token with id %s", r.o.id)
	}
	if err != nil {
		return err
	}
	if !changed {
		fmt.Fprintf(r.stdout, "Token %s (%s, %s) was revoked already.\n", t.ID, t.Name, t.AdminEmail)
		return nil
	}
	fmt.Fprintf(r.stdout, "Token %s (%s, %s) revoked; it stops working now.\n", t.ID, t.Name, t.AdminEmail)
	return nil
}

func adminTokenList(r *runner, _ []string) error {
	if err := r.required("email", r.o.email); err != nil {
		return err
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	u, err := r.admin(st, r.o.email)
	if err != nil {
		return err
	}
	list, err := st.AdminTokens(r.ctx, u.ID)
	if err != nil {
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "API tokens of %s:\n", u.Email)
	if len(list) == 0 {
		fmt.Fprintln(w, "  none")
	}
	for _, t := range list {
		state := "active"
		switch {
		case t.RevokedAt != nil:
			state = "revoked " + t.RevokedAt.UTC().Format(time.RFC3339)
		case t.ExpiresAt != nil && !t.ExpiresAt.After(time.Now()):
			state = "expired " + t.ExpiresAt.UTC().Format(time.RFC3339)
		case t.ExpiresAt != nil:
			state = "expires " + t.ExpiresAt.UTC().Format(time.RFC3339)
		}
		used := "never used"
		if t.LastUsedAt != nil {
			used = "last used " + t.LastUsedAt.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "  %s  %-5s  %s…  %s  (%s; %s)\n", t.ID, t.Scope, t.Prefix, t.Name, state, used)
	}
	return nil
}
