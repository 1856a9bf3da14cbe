package manage

import (
	"context"
	"errors"
	"flag"
	"fmt"
	netmail "net/mail"
	"net/url"
	"strings"
	"time"

	"github.com/converger/edge/core/login"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/passwords"
	"github.com/converger/edge/core/store"
)

// The users of the tenant portal (/portal).

// sendTimeout bounds the sending of an invitation email.
const sendTimeout = 30 * time.Second

func registerUsers() {
	userFlags := func(fs *flag.FlagSet, r *runner) {
		fs.StringVar(&r.o.tenant, "tenant", "", "the tenant's name (required)")
		fs.StringVar(&r.o.email, "email", "", "the user's email address (required)")
	}
	register(&command{
		group: "users", name: "create", args: "--tenant N --email E [--send-reset]",
		summary: "Creates a user of the tenant portal (/portal). Without --send-reset a random password is printed\n" +
			"once and must be changed at the first sign-in. With --send-reset no password is shown: a link to\n" +
			"choose one (valid 1 hour, once) is emailed through SMTP_URL (from SMTP_FROM), under PUBLIC_URL.",
		changes: true,
		flags: func(fs *flag.FlagSet, r *runner) {
			userFlags(fs, r)
			fs.BoolVar(&r.o.sendReset, "send-reset", false, "email a link to choose a password instead of printing one")
		},
		run: usersCreate,
	})
	register(&command{
		group: "users", name: "deactivate", args: "--tenant N --email E",
		summary: "Sets a portal user inactive: their sessions end now, their password reset links stop working,\n" +
			"and they cannot sign in.",
		changes: true, flags: userFlags, run: userStatus(store.StatusInactive),
	})
	register(&command{
		group: "users", name: "activate", args: "--tenant N --email E",
		summary: "Sets an inactive portal user active again: they can sign in with their password.",
		changes: true, flags: userFlags, run: userStatus(store.StatusActive),
	})
}

// invitation is how `users create --send-reset` reaches the new user.
type invitation struct {
	publicURL string
	mailer    mail.Sender
}

// invitationFromEnv checks what --send-reset needs before anything is created.
func (r *runner) invitationFromEnv() (*invitation, error) {
	publicURL := strings.TrimRight(strings.TrimSpace(r.env.Getenv("PUBLIC_URL")), "/")
	if u, err := url.Parse(publicURL); publicURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, failf("--send-reset needs PUBLIC_URL, the base URL users reach the core at (such as https://converger.example.com), for the link")
	}
	inv := &invitation{publicURL: publicURL, mailer: r.env.Mailer}
	if inv.mailer != nil {
		return inv, nil
	}
	raw := strings.TrimSpace(r.env.Getenv("SMTP_URL"))
	if raw == "" {
		return nil, failf("--send-reset needs SMTP_URL to send the link (without --send-reset a one-time password is printed)")
	}
	s, err := mail.ParseURL(raw)
	if err != nil {
		return nil, failf("SMTP_URL: %v", err)
	}
	if from := strings.TrimSpace(r.env.Getenv("SMTP_FROM")); from != "" {
		a, err := netmail.ParseAddress(from)
		if err != nil {
			return nil, failf("SMTP_FROM=%q: must be an email address", from)
		}
		s.From = a.String()
	}
	inv.mailer = s
	return inv, nil
}

func usersCreate(r *runner, _ []string) error {
	if err := r.required("tenant", r.o.tenant, "email", r.o.email); err != nil {
		return err
	}
	email := strings.TrimSpace(r.o.email)
	if err := store.CheckEmail(email); err != nil {
		return r.usagef("--email: %v", err)
	}
	var inv *invitation
	if r.o.sendReset {
		var err error
		if inv, err = r.invitationFromEnv(); err != nil {
			return err
		}
	}
	password := passwords.Generate()
	hash, err := passwords.Hash(password)
	if err != nil {
		return err
	}
	st, t, err := r.openTenant(r.o.tenant)
	if err != nil {
		return err
	}
	u, err := st.As(r.actor).CreateTenantUser(r.ctx, t.ID, email, hash, true)
	switch {
	case errors.Is(err, store.ErrConflict):
		return failf("tenant %s already has a portal user with email %s", t.Name, email)
	case errors.Is(err, store.ErrNotFound):
		return failf("no tenant named %q", r.o.tenant)
	case err != nil:
		return err
	}
	w := r.stdout
	fmt.Fprintf(w, "Portal user created.\n  id:       %s\n  tenant:   %s (%s)\n  email:    %s\n", u.ID, t.Name, t.ID, u.Email)
	if inv == nil {
		fmt.Fprintf(w, "  password: %s\n", password)
		fmt.Fprintf(w, "\nThe password is shown only this once: give it to the user, who must change it at the first\n"+
			"sign-in at /portal/login (tenant %s).\n", t.Name)
	} else if err := r.invite(st, inv, u); err != nil {
		return failf("the user was created, but the link could not be sent: %v\n"+
			"The user can ask for a link with \"Forgot your password?\" at /portal/login.", err)
	} else {
		fmt.Fprintf(w, "\nA link to choose a password was emailed to %s; it works once, within an hour.\n", u.Email)
	}
	if t.Status != store.StatusActive {
		fmt.Fprintf(w, "Note: tenant %s is %s, so the user cannot sign in until it is activated.\n", t.Name, t.Status)
	}
	return nil
}

// invite emails a new user the link to choose a password, and audits it.
func (r *runner) invite(st *store.Store, inv *invitation, u store.TenantUser) error {
	lu, err := st.LoginUserByID(r.ctx, store.KindTenant, u.ID)
	if err != nil {
		return err
	}
	link, err := login.ResetLink(r.ctx, st, inv.publicURL, lu, time.Now())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(r.ctx, sendTimeout)
	defer cancel()
	if err := inv.mailer.Send(ctx, login.InvitationMessage(lu, link)); err != nil {
		return err
	}
	return st.Audit(r.ctx, r.actor, "tenant_users.invite", "tenant_user:"+u.ID, map[string]any{"email": u.Email})
}

func userStatus(status string) func(*runner, []string) error {
	return func(r *runner, _ []string) error {
		if err := r.required("tenant", r.o.tenant, "email", r.o.email); err != nil {
			return err
		}
		st, t, err := r.openTenant(r.o.tenant)
		if err != nil {
			return err
		}
		email := strings.TrimSpace(r.o.email)
		u, err := st.TenantUserByEmail(r.ctx, t.ID, email)
		if errors.Is(err, store.ErrNotFound) {
			return failf("tenant %s has no portal user with email %s", t.Name, email)
		}
		if err != nil {
			return err
		}
		u, changed, err := st.As(r.actor).SetTenantUserStatus(r.ctx, u.ID, status)
		if err != nil {
			return err
		}
		switch {
		case !changed:
			fmt.Fprintf(r.stdout, "Portal user %s of tenant %s was already %s; nothing changed.\n", u.Email, t.Name, status)
		case status == store.StatusInactive:
			fmt.Fprintf(r.stdout, "Portal user %s of tenant %s deactivated: their sessions have ended and they cannot sign in.\n",
				u.Email, t.Name)
		default:
			fmt.Fprintf(r.stdout, "Portal user %s of tenant %s activated: they can sign in again.\n", u.Email, t.Name)
		}
		return nil
	}
}
