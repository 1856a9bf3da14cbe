package login

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
)

// BootstrapAdmin creates the first admin user (ADMIN_EMAIL, ADMIN_PASSWORD) when there is
// no admin yet; with an admin present it does nothing and reports false. With password
// empty a random password is generated and written once to out (the terminal's stderr,
// never the log), and must be changed at the first login. params hash the password
// (zero: passwords.Default).
func BootstrapAdmin(ctx context.Context, st *store.Store, email, password string, params passwords.Params, out io.Writer) (store.AdminUser, bool, error) {
	generated := password == ""
	if generated {
		password = passwords.Generate()
	} else if msg := checkNewPassword(password, password); msg != "" {
		return store.AdminUser{}, false, errors.New("ADMIN_PASSWORD: " + msg)
	}
	if params == (passwords.Params{}) {
		params = passwords.Default
	}
	hash, err := passwords.HashWith(password, params)
	if err != nil {
		return store.AdminUser{}, false, err
	}
	u, created, err := st.As("bootstrap:ADMIN_EMAIL").CreateFirstAdmin(ctx, email, hash, generated)
	if err != nil || !created {
		return u, created, err
	}
	if generated {
		fmt.Fprintf(out, "\nThe first admin user %s was created with this generated password, shown only this once:\n\n"+
			"    %s\n\nIt must be changed at the first login, at /admin/login.\n\n", u.Email, password)
	}
	return u, true, nil
}
