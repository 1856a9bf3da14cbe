// Package manage is the core's management commands (CORE_API.md §10): tenants (and
// their allowed origins), channels, per-tenant rate-limit overrides, portal users, admin
// users and their API tokens, run as `core <group> <command>`.
//
// Run takes the arguments after the program name and returns the exit status, so the
// commands are tested without a process: 0 done, 1 failed (the database, a missing
// tenant, a name taken, a missing DATABASE_URL or ENCRYPTION_KEY), 2 invalid command line
// (unknown command or flag, a missing or malformed argument). Messages go to stderr and
// name what to fix; results go to stdout.
//
// Secrets (API keys, channel secrets, publishable keys, admin tokens, generated
// passwords) are printed once, labelled as such, and stored only as hashes (the channel
// secret also sealed with ENCRYPTION_KEY). Every change is made through store.Operator, which writes the change
// and its audit_logs row (actor from --actor, default cli:$USER; no secrets) in one
// transaction; limit changes also NOTIFY rate_limit_overrides in that transaction.
package manage

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/mail"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/cmdline"
)

// Env is what the commands take from their process.
type Env struct {
	// Getenv reads DATABASE_URL, ENCRYPTION_KEY, USER, and for `users create
	// --send-reset` PUBLIC_URL, SMTP_URL and SMTP_FROM (os.Getenv).
	Getenv func(string) string
	// Stdin is read by `admins create --password-stdin`.
	Stdin io.Reader
	// Mailer sends `users create --send-reset`'s email; nil: SMTP_URL's server.
	Mailer mail.Sender
}

// Usage lists every command of the core binary.
const Usage = `usage: core <command> [arguments]

service:
  serve                                   run the HTTP API on CORE_ADDR (migrates first)
  migrate                                 apply the database migrations to DATABASE_URL

tenants:
  tenants create --name N                 create a tenant; prints its API key once
  tenants rotate-key --name N [--grace 24h]
                                          new API key, printed once; the old key keeps
                                          working for the grace (0s: stops at once)
  tenants deactivate --name N             refuse the tenant's API keys, channels, tokens and
                                          portal users (the sidecars at once too)
  tenants activate --name N               accept them again
  tenants origins set --name N ORIGIN ... the origins whose web pages may call the client
                                          API with the tenant's credentials (CORS); --none
                                          removes them all
  tenants origins show --name N           the tenant's allowed origins

channels:
  channels create --tenant N --name C --type echo|webhook [--mode inbound|outbound|duplex]
                                          create a channel; prints its secret and
                                          publishable key once (needs ENCRYPTION_KEY)
  channels deactivate --tenant N --name C refuse the channel's secret, publishable key,
                                          tokens and webhooks (the sidecars at once too)
  channels activate --tenant N --name C   accept them again
  channels update --tenant N --name C --require-signature=true|false
                                          whether inbound webhooks must be signed

portal users (the tenant portal, /portal):
  users create --tenant N --email E [--send-reset]
                                          create a portal user; prints a one-time password
                                          (to change at the first sign-in), or with
                                          --send-reset emails a link to choose one
  users deactivate --tenant N --email E   end the user's sessions and refuse their sign-in
  users activate --tenant N --email E     let the user sign in again

rate limits (per-tenant overrides of activity_create, upload, inbound, token_generate,
publishable_token; a window is a duration in whole milliseconds: 500ms, 1s, 60s, 1h):
  limits set --tenant N BUCKET=LIMIT/WINDOW ...
                                          e.g. inbound=2000/1s activity_create=300/1s
  limits show --tenant N                  the tenant's limits and where they come from
  limits clear --tenant N [BUCKET ...]    drop overrides (all when no bucket is named)

admin users:
  admins create --email E [--password-stdin]
                                          create an admin; without --password-stdin a
                                          random password is printed once and must be
                                          changed at the first login
  admins token create --email E --scope read|write [--name N] [--expires-in 90d]
                                          an API token for the console's API (/admin/api/v1),
                                          printed once
  admins token revoke --id ID             stop a token at once
  admins token list --email E             an admin's tokens (never the tokens themselves)

keys (no database):
  keys generate [--dir DIR]               new TOKEN_SIGNING_KEY, ENCRYPTION_KEY, TOKEN_VERIFY_KEYS
                                          and CLUSTER_SECRET_KEY, as NAME=value lines or files
  keys public [--stdin]                   the sidecars' TOKEN_VERIFY_KEYS for TOKEN_SIGNING_KEY (and
                                          the keys still accepted), with each key's kid

  help                                    this text; core <group> <command> -h for one command
  version                                 the version and VCS revision of this binary (also --version)

Every command but keys reads DATABASE_URL. Commands that change something take --actor NAME
for the audit log (default cli:$USER). Any variable may be given as a file instead,
NAME_FILE=/path. Exit status: 0 done, 1 failed, 2 invalid command line.
`

// usageError is an invalid command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// failure is a failed command: exit status 1.
type failure struct{ msg string }

func (e *failure) Error() string { return e.msg }

func failf(format string, args ...any) error { return &failure{fmt.Sprintf(format, args...)} }

type command struct {
	group, name string
	args        string // the synopsis after "core group name"
	summary     string
	changes     bool // takes --actor
	flags       func(fs *flag.FlagSet, r *runner)
	run         func(r *runner, pos []string) error
	positional  bool // takes positional arguments
}

func (c *command) full() string { return c.group + " " + c.name }

func (c *command) usage(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintf(w, "usage: core %s %s\n\n%s\n", c.full(), c.args, c.summary)
	if fs != nil {
		fmt.Fprintln(w, "\nflags:")
		fs.SetOutput(w)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
}

var commands []*command

func register(c *command) { commands = append(commands, c) }

// lookupArgs finds the command that args (after the group) name, one word ("create")
// or two ("origins set"), and returns it with the arguments after its name.
func lookupArgs(group string, args []string) (*command, []string) {
	if len(args) > 1 {
		if c := lookup(group, args[0]+" "+args[1]); c != nil {
			return c, args[2:]
		}
	}
	return lookup(group, args[0]), args[1:]
}

// subcommands lists the commands of group whose name starts with the word ("set, show"
// for "origins"), or "".
func subcommands(group, word string) string {
	var names []string
	for _, c := range commands {
		if rest, ok := strings.CutPrefix(c.name, word+" "); ok && c.group == group {
			names = append(names, rest)
		}
	}
	return strings.Join(names, ", ")
}

func lookup(group, name string) *command {
	for _, c := range commands {
		if c.group == group && c.name == name {
			return c
		}
	}
	return nil
}

func groupExists(group string) bool {
	for _, c := range commands {
		if c.group == group {
			return true
		}
	}
	return false
}

func groupUsage(group string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: core %s <command>\n\ncommands:\n", group)
	for _, c := range commands {
		if c.group == group {
			fmt.Fprintf(&b, "  core %s %s\n", c.full(), c.args)
		}
	}
	return b.String()
}

// runner is one command's run: its flags' values, its output and its database.
type runner struct {
	ctx    context.Context
	env    Env
	stdout io.Writer
	stderr io.Writer
	actor  string
	cmd    *command
	o      options

	pool *pgxpool.Pool
}

// options are the values of every command's flags.
type options struct {
	name, tenant, typ, mode, email string
	scope, expiresIn, id           string // admins token
	grace                          time.Duration
	passwordStdin, sendReset, none bool
	requireSignature               optionalBool
	dir                            string // keys generate --dir
	keysStdin                      bool   // keys public --stdin
}

// optionalBool is a boolean flag that must be given explicitly (--flag=true|false).
type optionalBool struct {
	set, value bool
}

func (b *optionalBool) String() string {
	if b == nil || !b.set {
		return ""
	}
	return strconv.FormatBool(b.value)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("must be true or false")
	}
	b.set, b.value = true, v
	return nil
}

// Run runs the command in args (the arguments after the program name) and returns the
// exit status.
func Run(ctx context.Context, args []string, env Env, stdout, stderr io.Writer) int {
	if env.Getenv == nil {
		env.Getenv = func(string) string { return "" }
	}
	if len(args) == 0 {
		fmt.Fprint(stderr, Usage)
		return 2
	}
	switch args[0] {
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, cmdline.Version("core"))
		return 0
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && groupExists(args[1]) {
			fmt.Fprint(stdout, groupUsage(args[1]))
			return 0
		}
		fmt.Fprint(stdout, Usage)
		return 0
	}
	group := args[0]
	if !groupExists(group) {
		fmt.Fprintf(stderr, "core: unknown command %q\n\n%s", group, Usage)
		return 2
	}
	if len(args) < 2 {
		fmt.Fprintf(stderr, "core %s: which command?\n\n%s", group, groupUsage(group))
		return 2
	}
	switch args[1] {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, groupUsage(group))
		return 0
	}
	cmd, rest := lookupArgs(group, args[1:])
	if cmd == nil && len(args) == 2 && subcommands(group, args[1]) != "" {
		fmt.Fprintf(stderr, "core %s %s: which command? (%s)\n\n%s", group, args[1], subcommands(group, args[1]), groupUsage(group))
		return 2
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "core %s: unknown command %q\n\n%s", group, args[1], groupUsage(group))
		return 2
	}
	r := &runner{ctx: ctx, env: env, stdout: stdout, stderr: stderr, cmd: cmd}
	defer r.close()
	err := r.exec(rest)
	var ue *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "core %s: %s\n", cmd.full(), ue.msg)
		fmt.Fprintf(stderr, "usage: core %s %s (core %s -h for details)\n", cmd.full(), cmd.args, cmd.full())
		return 2
	default:
		fmt.Fprintf(stderr, "core %s: %s\n", cmd.full(), describe(err))
		return 1
	}
}

func (r *runner) exec(args []string) error {
	fs := flag.NewFlagSet("core "+r.cmd.full(), flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if r.cmd.changes {
		fs.StringVar(&r.actor, "actor", "", "who makes the change, for the audit log (default cli:$USER)")
	}
	if r.cmd.flags != nil {
		r.cmd.flags(fs, r)
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		r.cmd.usage(r.stdout, fs)
		return err
	}
	if err != nil {
		return &usageError{err.Error()}
	}
	if len(pos) > 0 && !r.cmd.positional {
		return &usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	if r.cmd.changes {
		if r.actor, err = resolveActor(r.actor, r.env.Getenv); err != nil {
			return &usageError{err.Error()}
		}
	}
	return r.cmd.run(r, pos)
}

// parseInterspersed parses flags wherever they stand among the positional arguments,
// which it returns ("limits set BUCKET=... --tenant N" works as well).
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at "--" (consumed) or at the first non-flag.
		if len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func resolveActor(flagValue string, getenv func(string) string) (string, error) {
	actor := strings.TrimSpace(flagValue)
	if actor == "" {
		user := strings.TrimSpace(getenv("USER"))
		if user == "" {
			user = strings.TrimSpace(getenv("LOGNAME"))
		}
		if user == "" {
			user = "unknown"
		}
		actor = "cli:" + user
	}
	if len(actor) > 200 || strings.IndexFunc(actor, unicode.IsControl) >= 0 {
		return "", errors.New("--actor must be at most 200 characters without control characters")
	}
	return actor, nil
}

// required reports a missing flag as a usage error.
func (r *runner) required(values ...string) error {
	for i := 0; i+1 < len(values); i += 2 {
		if strings.TrimSpace(values[i+1]) == "" {
			return &usageError{fmt.Sprintf("--%s is required", values[i])}
		}
	}
	return nil
}

func (r *runner) usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

// store opens DATABASE_URL; sealer may be nil.
func (r *runner) store(sealer *credentials.Sealer) (*store.Store, error) {
	url := strings.TrimSpace(r.env.Getenv("DATABASE_URL"))
	if url == "" {
		return nil, failf("DATABASE_URL is required (e.g. postgres://user:password@localhost:5432/converger)")
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL with its password.
		return nil, failf("DATABASE_URL is not a valid PostgreSQL connection string")
	}
	cfg.MaxConns = 2
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(r.ctx, cfg)
	if err != nil {
		return nil, failf("DATABASE_URL: %v", err)
	}
	r.pool = pool
	if err := pool.Ping(r.ctx); err != nil {
		return nil, failf("cannot reach the database at DATABASE_URL: %v", err)
	}
	return store.New(pool, sealer, activity.DefaultLimits), nil
}

func (r *runner) close() {
	if r.pool != nil {
		r.pool.Close()
	}
}

// tenant looks a tenant up by name.
func (r *runner) tenant(st *store.Store, name string) (store.Tenant, error) {
	t, err := st.TenantByName(r.ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return t, failf("no tenant named %q", name)
	}
	return t, err
}

// openTenant opens DATABASE_URL (without a sealer) and looks a tenant up by name.
func (r *runner) openTenant(name string) (*store.Store, store.Tenant, error) {
	st, err := r.store(nil)
	if err != nil {
		return nil, store.Tenant{}, err
	}
	t, err := r.tenant(st, name)
	return st, t, err
}

// openChannel opens DATABASE_URL and looks a channel up by its tenant's name and its own.
func (r *runner) openChannel(tenantName, name string) (*store.Store, store.Tenant, store.Channel, error) {
	st, t, err := r.openTenant(tenantName)
	if err != nil {
		return nil, t, store.Channel{}, err
	}
	c, err := st.ChannelByName(r.ctx, t.ID, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, t, c, failf("tenant %s has no channel named %q", t.Name, name)
	}
	return st, t, c, err
}

// describe turns an error into a message for the operator.
func describe(err error) string {
	var f *failure
	if errors.As(err, &f) {
		return f.msg
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42P01" {
		return "the database has no core schema yet: run `core migrate` first (" + pe.Message + ")"
	}
	if errors.Is(err, context.Canceled) {
		return "interrupted"
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	return err.Error()
}
