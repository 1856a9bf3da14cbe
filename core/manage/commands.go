package manage

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
)

func init() {
	register(&command{
		group: "tenants", name: "create", args: "--name N",
		summary: "Creates a tenant and prints its API key once. Names are unique regardless of case.",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.name, "name", "", "the tenant's name (required)")
		},
		run: tenantsCreate,
	})
	register(&command{
		group: "tenants", name: "rotate-key", args: "--name N [--grace 24h]",
		summary: "Gives a tenant a new API key, printed once. The replaced key keeps working for the grace.\n" +
			"There is one slot for a replaced key: rotating again within the grace stops the key\n" +
			"replaced by the earlier rotation at once, so only the newest key and the one it replaced work.",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.name, "name", "", "the tenant's name (required)")
			fs.DurationVar(&r.o.grace, "grace", store.DefaultKeyGrace, "how long the replaced key keeps working; 0s stops it at once (at most 720h)")
		},
		run: tenantsRotateKey,
	})
	registerStatus()
	registerOrigins()
	register(&command{
		group: "channels", name: "create", args: "--tenant N --name C --type echo|webhook [--mode inbound|outbound|duplex]",
		summary: "Creates a channel of a tenant and prints its secret and publishable key once.\n" +
			"Needs ENCRYPTION_KEY, the same key the core serves with: the secret is stored sealed with it.",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.tenant, "tenant", "", "the tenant's name (required)")
			fs.StringVar(&r.o.name, "name", "", "the channel's name, unique within the tenant (required)")
			fs.StringVar(&r.o.typ, "type", "", "echo or webhook (required)")
			fs.StringVar(&r.o.mode, "mode", "duplex", "inbound, outbound or duplex")
		},
		run: channelsCreate,
	})
	registerLimits()
	registerUsers()
	registerKeys()
	register(&command{
		group: "admins", name: "create", args: "--email E [--password-stdin]",
		summary: "Creates an admin user. Without --password-stdin a random password is printed once and must\n" +
			"be changed at the first login. With it, the password is read from standard input (one line,\n" +
			fmt.Sprintf("%d to %d characters).", minPasswordChars, passwords.MaxLength),
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			fs.StringVar(&r.o.email, "email", "", "the admin's email address (required)")
			fs.BoolVar(&r.o.passwordStdin, "password-stdin", false, "read the password from standard input")
		},
		run: adminsCreate,
	})
	registerAdminTokens()
}

func tenantsCreate(r *runner, _ []string) error {
	if err := r.required("name", r.o.name); err != nil {
		return err
	}
	if err := store.CheckName("--name", r.o.name); err != nil {
		return r.usagef("%v", err)
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	t, key, err := st.As(r.actor).CreateTenant(r.ctx, r.o.name)
	if errors.Is(err, store.ErrConflict) {
		return failf("a tenant named %q already exists (names are unique regardless of case)", r.o.name)
	}
	if err != nil {
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "Tenant created.\n  id:      %s\n  name:    %s\n  api key: %s\n", t.ID, t.Name, key)
	fmt.Fprintf(w, "\nThe API key is shown only this once and cannot be recovered: store it now.\n"+
		"(`core tenants rotate-key --name %s` replaces it.)\n", quoteArg(t.Name))
	return nil
}

func tenantsRotateKey(r *runner, _ []string) error {
	if err := r.required("name", r.o.name); err != nil {
		return err
	}
	if r.o.grace < 0 || r.o.grace > store.MaxKeyGrace {
		return r.usagef("--grace must be from 0s to %s", store.MaxKeyGrace)
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	t, err := r.tenant(st, r.o.name)
	if err != nil {
		return err
	}
	rot, err := st.As(r.actor).RotateAPIKey(r.ctx, t.ID, r.o.grace)
	if errors.Is(err, store.ErrNotFound) {
		return failf("no tenant named %q", r.o.name)
	}
	if err != nil {
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "API key of tenant %s (%s) rotated.\n  api key: %s\n", rot.Tenant.Name, rot.Tenant.ID, rot.Key)
	fmt.Fprintf(w, "\nThe new API key is shown only this once and cannot be recovered: store it now.\n")
	if rot.PreviousExpiresAt.IsZero() {
		fmt.Fprintf(w, "The replaced key (%s...) stopped working now.\n", rot.PreviousPrefix)
	} else {
		fmt.Fprintf(w, "The replaced key (%s...) keeps working until %s (grace %s).\n",
			rot.PreviousPrefix, rot.PreviousExpiresAt.UTC().Format(time.RFC3339), r.o.grace)
	}
	if rot.DroppedPrevious {
		fmt.Fprintf(w, "The key replaced by the previous rotation was still within its grace and stopped working now.\n")
	}
	if rot.Tenant.Status != "active" {
		fmt.Fprintf(w, "Note: the tenant is %s, so no key of it works.\n", rot.Tenant.Status)
	}
	return nil
}

func channelsCreate(r *runner, _ []string) error {
	if err := r.required("tenant", r.o.tenant, "name", r.o.name, "type", r.o.typ); err != nil {
		return err
	}
	if err := store.CheckName("--name", r.o.name); err != nil {
		return r.usagef("%v", err)
	}
	if !slices.Contains(store.ChannelTypes, r.o.typ) {
		return r.usagef("--type %q: must be one of %s", r.o.typ, strings.Join(store.ChannelTypes, ", "))
	}
	if !slices.Contains(store.ChannelModes, r.o.mode) {
		return r.usagef("--mode %q: must be one of %s", r.o.mode, strings.Join(store.ChannelModes, ", "))
	}
	keyText := strings.TrimSpace(r.env.Getenv("ENCRYPTION_KEY"))
	if keyText == "" {
		return failf("ENCRYPTION_KEY is required to create channels: the same key the core serves with (the base64 of 32 random bytes; `core keys generate` makes one)")
	}
	sealer, err := credentials.ParseEncryptionKey(keyText)
	if err != nil {
		return failf("ENCRYPTION_KEY: %v", err)
	}
	st, err := r.store(sealer)
	if err != nil {
		return err
	}
	t, err := r.tenant(st, r.o.tenant)
	if err != nil {
		return err
	}
	c, sec, err := st.As(r.actor).CreateChannel(r.ctx, t.ID, r.o.name, r.o.typ, r.o.mode)
	switch {
	case errors.Is(err, store.ErrConflict):
		return failf("tenant %s already has a channel named %q", t.Name, r.o.name)
	case errors.Is(err, store.ErrNotFound):
		return failf("no tenant named %q", r.o.tenant)
	case err != nil:
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "Channel created.\n  id:              %s\n  tenant:          %s (%s)\n  name:            %s\n  type:            %s\n  mode:            %s\n",
		c.ID, t.Name, t.ID, c.Name, c.Type, c.Mode)
	fmt.Fprintf(w, "  secret:          %s\n  publishable key: %s\n", sec.Secret, sec.Publishable)
	fmt.Fprintf(w, "\nThe channel secret and the publishable key are shown only this once and cannot be recovered: store them now.\n"+
		"The secret is for servers (Authorization: Bearer <secret> on POST /api/v1/converger/tokens/generate);\n"+
		"the publishable key may be embedded in a web page (POST /api/v1/converger/tokens/publishable).\n")
	if t.Status != "active" {
		fmt.Fprintf(w, "Note: tenant %s is %s, so the channel refuses traffic.\n", t.Name, t.Status)
	}
	return nil
}

const minPasswordChars = 12

func adminsCreate(r *runner, _ []string) error {
	if err := r.required("email", r.o.email); err != nil {
		return err
	}
	email := strings.TrimSpace(r.o.email)
	if err := store.CheckEmail(email); err != nil {
		return r.usagef("--email: %v", err)
	}
	password, generated := "", !r.o.passwordStdin
	if generated {
		password = passwords.Generate()
	} else {
		var err error
		if password, err = readPassword(r.env.Stdin); err != nil {
			return r.usagef("%v", err)
		}
	}
	hash, err := passwords.Hash(password)
	if err != nil {
		return err
	}
	st, err := r.store(nil)
	if err != nil {
		return err
	}
	u, err := st.As(r.actor).CreateAdminUser(r.ctx, email, hash, generated)
	if errors.Is(err, store.ErrConflict) {
		return failf("an admin user with email %s already exists", email)
	}
	if err != nil {
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "Admin user created.\n  id:       %s\n  email:    %s\n", u.ID, u.Email)
	if generated {
		fmt.Fprintf(w, "  password: %s\n", password)
		fmt.Fprintf(w, "\nThe password is shown only this once: store it now. It must be changed at the first login.\n")
	} else {
		fmt.Fprintf(w, "  password: (read from standard input; not shown)\n")
	}
	return nil
}

// readPassword reads one line from stdin: the trailing newline is dropped, and anything
// after it refused, so that a pasted block is not taken as one password.
func readPassword(stdin io.Reader) (string, error) {
	if stdin == nil {
		return "", errors.New("--password-stdin: no standard input")
	}
	b, err := io.ReadAll(io.LimitReader(stdin, passwords.MaxLength+3))
	if err != nil {
		return "", fmt.Errorf("--password-stdin: reading standard input: %v", err)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	switch {
	case bytes.ContainsAny(b, "\r\n"):
		return "", errors.New("--password-stdin: standard input must hold the password on one line")
	case len(b) > passwords.MaxLength:
		return "", fmt.Errorf("--password-stdin: the password is longer than %d bytes", passwords.MaxLength)
	case !utf8.Valid(b):
		return "", errors.New("--password-stdin: the password is not valid UTF-8")
	case utf8.RuneCount(b) < minPasswordChars:
		return "", fmt.Errorf("--password-stdin: the password must have at least %d characters", minPasswordChars)
	}
	return string(b), nil
}

// quoteArg quotes a name for a shell command line when it needs it.
func quoteArg(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
