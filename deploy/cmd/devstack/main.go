// Command devstack is what `make run` starts: a throwaway PostgreSQL under ./.data
// (unless DATABASE_URL is set), the migrations, development keys under ./.data, a demo
// tenant and echo channel on first start, then the sidecar and the core (with
// AUTHZ_ADDR, so that the core asks the sidecar about every request as Envoy would) as
// child processes. Ctrl-C stops everything; if a child dies, the rest is stopped and
// devstack exits non-zero.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/cmdline"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"

	"github.com/converger/edge/shared/testpki"
)

const dataDir = ".data"

// The files devstack keeps under ./.data.
const (
	signingKeyFile    = "token_signing_key"
	encryptionKeyFile = "encryption_key"
	credentialsFile   = "demo-credentials"
	// envFile holds the stack's settings for the management commands (`. ./.data/env`).
	envFile = "env"
	// portFile keeps the port of the throwaway PostgreSQL across starts.
	portFile = "postgres.port"
)

// The demo tenant and channel created on first start.
const (
	demoTenant  = "demo"
	demoChannel = "demo-echo"
)

const usage = `usage: devstack [--help] [--version]

What ` + "`make run`" + ` starts, from the repository root: a PostgreSQL under ./.data (unless
DATABASE_URL is set), the migrations, development keys, a demo tenant and echo channel on
first start, then the sidecar and the core (bin/sidecar and bin/core beside devstack) in the
foreground. It writes ./.data/env (DATABASE_URL, the keys; source it for bin/core's
management commands) and ./.data/demo-credentials. Ctrl-C stops everything.

Environment: CORE_ADDR (127.0.0.1:8080), SIDECAR_GRPC_ADDR (127.0.0.1:8081),
SIDECAR_HTTP_ADDR (127.0.0.1:8082), PUBLIC_URL, DATABASE_URL, LOG_FORMAT (text), and
the core's ADMIN_EMAIL and ADMIN_PASSWORD.

-mtls puts the sidecar's gRPC port on mutual TLS with certificates made under ./.data/tls
at each start, and the core's AUTHZ_ADDR and LIMITER_ADDR clients on it (docs/security.md).
`

func main() {
	fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage) }
	mtls := fs.Bool("mtls", false, "the sidecar's gRPC port on mutual TLS, and the core's AUTHZ_ADDR and LIMITER_ADDR clients with it")
	if code, exit := cmdline.Parse(fs, os.Args[1:], false, os.Stdout, os.Stderr); exit {
		os.Exit(code)
	}
	if err := run(*mtls); err != nil {
		fmt.Fprintf(os.Stderr, "devstack: %v\n", err)
		os.Exit(1)
	}
}

func run(mtls bool) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}
	bin, err := os.Executable()
	if err != nil {
		return err
	}
	binDir := filepath.Dir(bin)
	for _, b := range []string{"core", "sidecar"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return fmt.Errorf("%s is missing next to devstack: run `make build` (or `make run`, which builds first)", filepath.Join(binDir, b))
		}
	}

	coreAddr := envOr("CORE_ADDR", "127.0.0.1:8080")
	opsAddr := envOr("CORE_OPS_ADDR", "127.0.0.1:8083")
	grpcAddr := envOr("SIDECAR_GRPC_ADDR", "127.0.0.1:8081")
	httpAddr := envOr("SIDECAR_HTTP_ADDR", "127.0.0.1:8082")
	publicURL := strings.TrimRight(envOr("PUBLIC_URL", "http://"+coreAddr), "/")

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL != "" && dbURL == previousEnv(filepath.Join(dir, envFile))["DATABASE_URL"] {
		// The shell sourced ./.data/env: that is our own PostgreSQL, not an external one.
		dbURL = ""
	}
	if dbURL == "" {
		fmt.Println("starting a throwaway PostgreSQL under", filepath.Join(dir, "postgres"))
		portPath := filepath.Join(dir, portFile)
		port := keptPort(portPath)
		pg, err := pgserver.Start(ctx, pgserver.Options{Dir: filepath.Join(dir, "postgres"), Port: port})
		if err != nil {
			return err
		}
		defer func() {
			if err := pg.Stop(); err != nil {
				fmt.Fprintf(os.Stderr, "devstack: stopping PostgreSQL: %v\n", err)
			}
		}()
		dbURL = pg.URL()
		if err := keepPort(portPath, dbURL); err != nil {
			return err
		}
	}
	if err := migrations.Up(ctx, dbURL); err != nil {
		return err
	}

	signingKey, err := readOrCreateKey(filepath.Join(dir, signingKeyFile), token.GenerateKey)
	if err != nil {
		return err
	}
	signer, err := token.ParseSigningKey(signingKey)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, signingKeyFile), err)
	}
	encKey, err := readOrCreateKey(filepath.Join(dir, encryptionKeyFile), func() (string, error) {
		return credentials.GenerateEncryptionKey(), nil
	})
	if err != nil {
		return err
	}
	sealer, err := credentials.ParseEncryptionKey(encKey)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, encryptionKeyFile), err)
	}
	demo, note, err := demoCredentials(ctx, dbURL, sealer, filepath.Join(dir, credentialsFile))
	if err != nil {
		return err
	}
	if err := writeEnv(filepath.Join(dir, envFile), []envVar{
		{"DATABASE_URL", dbURL},
		{"ENCRYPTION_KEY", encKey},
		{"TOKEN_SIGNING_KEY", signingKey},
		{"TOKEN_VERIFY_KEYS", signer.PublicKey()},
	}); err != nil {
		return err
	}

	var sidecarTLS, coreTLS []string
	if mtls {
		if sidecarTLS, coreTLS, err = devTLS(filepath.Join(dir, tlsDir)); err != nil {
			return err
		}
	}
	// The sidecar first: the core asks it about every request.
	sidecar, err := start("sidecar", filepath.Join(binDir, "sidecar"), nil, append([]string{
		"SIDECAR_GRPC_ADDR=" + grpcAddr,
		"SIDECAR_HTTP_ADDR=" + httpAddr,
		"DATABASE_URL=" + dbURL,
		"TOKEN_VERIFY_KEYS=" + signer.PublicKey(),
		"LOG_FORMAT=" + envOr("LOG_FORMAT", "text"),
	}, sidecarTLS...)...)
	if err != nil {
		return err
	}
	children := []*child{sidecar}
	defer func() { stopAll(children) }()
	if err := waitReady(ctx, sidecar, "http://"+httpAddr+"/readyz", true); err != nil {
		return err
	}
	core, err := start("core", filepath.Join(binDir, "core"), []string{"serve"}, append([]string{
		"CORE_ADDR=" + coreAddr,
		"CORE_OPS_ADDR=" + opsAddr,
		"PUBLIC_URL=" + publicURL,
		"DATABASE_URL=" + dbURL,
		"TOKEN_SIGNING_KEY=" + signingKey,
		"ENCRYPTION_KEY=" + encKey,
		"AUTHZ_ADDR=" + grpcAddr,
		"LIMITER_ADDR=" + grpcAddr,
		"LOG_FORMAT=" + envOr("LOG_FORMAT", "text"),
	}, coreTLS...)...)
	if err != nil {
		return err
	}
	children = []*child{core, sidecar} // stopped in this order
	// Any HTTP answer (the JSON 404 of /) means the core listens.
	if err := waitReady(ctx, core, "http://"+coreAddr+"/", false); err != nil {
		return err
	}

	printHowTo(os.Stdout, howTo{DatabaseURL: redact(dbURL), Base: publicURL, GRPCAddr: grpcAddr,
		HTTPAddr: httpAddr, OpsAddr: opsAddr, Demo: demo, Note: note, CredentialsFile: filepath.Join(dataDir, credentialsFile),
		EnvFile: filepath.Join(dataDir, envFile)})

	select {
	case <-ctx.Done():
		stopAll(children)
		fmt.Println("stopped")
		return nil
	case c := <-exited(children):
		return fmt.Errorf("the %s stopped (%v); stopping the rest", c.name, c.err)
	}
}

// readOrCreateKey reads a key file, creating it (0600) with gen on first start.
func readOrCreateKey(path string, gen func() (string, error)) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		k, err := gen()
		if err != nil {
			return "", err
		}
		if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
			return "", err
		}
		return k, nil
	}
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// keptPort is the port the throwaway PostgreSQL had at the last start, if it is still
// free; else 0, a free one.
func keptPort(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || port <= 0 || port > 65535 {
		return 0
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		fmt.Printf("PostgreSQL's port %d of the last start is taken; using another one (DATABASE_URL in %s changes)\n", port, filepath.Join(dataDir, envFile))
		return 0
	}
	l.Close()
	return port
}

// keepPort records the port of dbURL for the next start.
func keepPort(path, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil || u.Port() == "" {
		return fmt.Errorf("the throwaway PostgreSQL's URL has no port: %q", redact(dbURL))
	}
	return os.WriteFile(path, []byte(u.Port()+"\n"), 0o644)
}

// envVar is one line of ./.data/env.
type envVar struct{ name, value string }

const envHeader = `# The settings of the development stack of ` + "`make run`" + `, written at every start: development
# values only. Load them into a shell for bin/core's management commands, for instance:
#   . ./.data/env && bin/core tenants create --name acme
`

// writeEnv writes the stack's settings as a shell file of exports (0600: keys).
func writeEnv(path string, vars []envVar) error {
	var b strings.Builder
	b.WriteString(envHeader)
	for _, v := range vars {
		fmt.Fprintf(&b, "export %s=%s\n", v.name, shellQuote(v.value))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600) // an existing file keeps its mode otherwise
}

// previousEnv reads the variables of an earlier ./.data/env; nil when there is none.
func previousEnv(path string) map[string]string {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if uq, err := shellUnquote(v); err == nil {
			out[k] = uq
		}
	}
	return out
}

// shellQuote quotes s for a POSIX shell: in single quotes, each quote inside closed, escaped and reopened.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// shellUnquote reverses shellQuote.
func shellUnquote(s string) (string, error) {
	if len(s) < 2 || s[0] != '\'' || s[len(s)-1] != '\'' {
		return "", errors.New("not single-quoted")
	}
	return strings.ReplaceAll(s[1:len(s)-1], `'\''`, "'"), nil
}

// Demo holds the demo tenant's and channel's development credentials, as saved in
// ./.data/demo-credentials (shell variable assignments, so `. ./.data/demo-credentials`
// loads them).
type Demo struct {
	TenantID, APIKey, ChannelID, ChannelSecret, PublishableKey string
}

// vars are the variable names of the credentials file.
func (d *Demo) vars() []struct {
	name string
	val  *string
} {
	return []struct {
		name string
		val  *string
	}{
		{"DEMO_TENANT_ID", &d.TenantID},
		{"DEMO_API_KEY", &d.APIKey},
		{"DEMO_CHANNEL_ID", &d.ChannelID},
		{"DEMO_CHANNEL_SECRET", &d.ChannelSecret},
		{"DEMO_PUBLISHABLE_KEY", &d.PublishableKey},
	}
}

const credentialsHeader = `# Development credentials of the demo tenant "` + demoTenant + `" and its echo channel "` + demoChannel + `",
# created by ` + "`make run`" + ` on first start. Load them into a shell with:  . ./.data/demo-credentials
`

// Marshal renders the credentials file.
func (d Demo) Marshal() []byte {
	var b strings.Builder
	b.WriteString(credentialsHeader)
	for _, v := range d.vars() {
		fmt.Fprintf(&b, "%s=%s\n", v.name, *v.val)
	}
	return []byte(b.String())
}

// ParseDemo reads a credentials file; every variable must be there.
func ParseDemo(b []byte) (Demo, error) {
	var d Demo
	got := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return Demo{}, fmt.Errorf("not a NAME=value line: %q", line)
		}
		got[k] = v
	}
	for _, v := range d.vars() {
		if got[v.name] == "" {
			return Demo{}, fmt.Errorf("%s is missing", v.name)
		}
		*v.val = got[v.name]
	}
	return d, nil
}

// demoCredentials creates the demo tenant and echo channel through the core's store
// when the database has no tenant yet, and saves their credentials (0600); on later
// starts it reads them back and checks that they still work. note explains a missing
// demo (a database with other tenants, or credentials that no longer work).
func demoCredentials(ctx context.Context, dbURL string, sealer *credentials.Sealer, path string) (d *Demo, note string, err error) {
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return nil, "", err
	}
	defer pool.Close()
	st := store.New(pool, sealer, activity.DefaultLimits)
	var tenants int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM tenants`).Scan(&tenants); err != nil {
		return nil, "", err
	}
	if tenants == 0 {
		t, key, err := st.As("devstack").CreateTenant(ctx, demoTenant)
		if err != nil {
			return nil, "", fmt.Errorf("creating the demo tenant: %w", err)
		}
		ch, sec, err := st.As("devstack").CreateChannel(ctx, t.ID, demoChannel, "echo", "duplex")
		if err != nil {
			return nil, "", fmt.Errorf("creating the demo channel: %w", err)
		}
		d := &Demo{TenantID: t.ID, APIKey: key, ChannelID: ch.ID, ChannelSecret: sec.Secret, PublishableKey: sec.Publishable}
		if err := os.WriteFile(path, d.Marshal(), 0o600); err != nil {
			return nil, "", err
		}
		fmt.Printf("created the demo tenant %q and its echo channel %q; their credentials are in %s\n", demoTenant, demoChannel, path)
		return d, "", nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Sprintf("The database already has tenants, so no demo tenant was created and %s does not exist.\n"+
			"Create one with: bin/core tenants create --name demo && bin/core channels create --tenant demo --name demo-echo --type echo", path), nil
	}
	if err != nil {
		return nil, "", err
	}
	demo, err := ParseDemo(b)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w (delete it, and the database under .data, to start afresh)", path, err)
	}
	if _, err := st.TenantByAPIKey(ctx, demo.APIKey); err != nil {
		return nil, fmt.Sprintf("The credentials in %s do not work with this database (another DATABASE_URL, or the key was rotated).", path), nil
	}
	return &demo, "", nil
}

// child is a running child process.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when it has exited; err is set before
	err  error
}

// start runs a binary with this environment plus env, in its own process group (a
// Ctrl-C on the terminal reaches devstack only, which stops the children in order),
// killed by the kernel if devstack dies. Its output goes to ours, each line prefixed.
// tlsDir holds the certificates of -mtls, under the data directory.
const tlsDir = "tls"

// devTLS makes a development CA, a certificate for the sidecar (localhost) and one for
// the core as its client (spiffe://converger.local/core, the only identity the sidecar
// allows), in dir, anew at every start; and returns the variables of both.
func devTLS(dir string) (sidecar, core []string, err error) {
	const coreID = "spiffe://converger.local/core"
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	ca, err := testpki.NewCA("converger development CA")
	if err != nil {
		return nil, nil, err
	}
	server, err := ca.Issue(testpki.Localhost("sidecar"))
	if err == nil {
		err = ca.Write(server, dir, "sidecar")
	}
	var client *testpki.Pair
	if err == nil {
		if client, err = ca.Issue(testpki.Leaf{Name: "core", URIs: []string{coreID}}); err == nil {
			err = ca.Write(client, dir, "core")
		}
	}
	if err != nil {
		return nil, nil, err
	}
	sidecar = []string{"SIDECAR_GRPC_TLS_CERT_FILE=" + server.CertFile, "SIDECAR_GRPC_TLS_KEY_FILE=" + server.KeyFile,
		"SIDECAR_GRPC_TLS_CLIENT_CA_FILE=" + server.CAFile, "SIDECAR_GRPC_TLS_ALLOWED_CLIENTS=" + coreID}
	for _, c := range []string{"AUTHZ_TLS", "LIMITER_TLS"} {
		core = append(core, c+"_CA_FILE="+server.CAFile, c+"_CERT_FILE="+client.CertFile, c+"_KEY_FILE="+client.KeyFile, c+"_SERVER_NAME=localhost")
	}
	return sidecar, core, nil
}

func start(name, path string, args []string, env ...string) (*child, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out := &prefixWriter{prefix: fmt.Sprintf("%-7s | ", name), w: os.Stdout}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		out.flush()
		close(c.done)
	}()
	return c, nil
}

// stop asks the child to stop (SIGTERM) and kills it after 10 seconds.
func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// stopAll stops the children one after the other.
func stopAll(cs []*child) {
	for _, c := range cs {
		c.stop()
	}
}

// exited reports the first child to exit.
func exited(cs []*child) <-chan *child {
	ch := make(chan *child, len(cs))
	for _, c := range cs {
		go func() {
			<-c.done
			ch <- c
		}()
	}
	return ch
}

// waitReady polls url until it answers (200 when want200), the child exits, ctx ends,
// or 30 seconds pass.
func waitReady(ctx context.Context, c *child, url string, want200 bool) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var lastErr error
		resp, err := client.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if !want200 || resp.StatusCode == http.StatusOK {
				return nil
			}
			lastErr = fmt.Errorf("status %s", resp.Status)
		} else {
			lastErr = err
		}
		select {
		case <-c.done:
			return fmt.Errorf("the %s exited while starting (%v)", c.name, c.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the %s is not ready after 30s: %s: %v", c.name, url, lastErr)
		}
	}
}

// prefixWriter writes a child's output line by line with a prefix.
type prefixWriter struct {
	prefix string
	w      io.Writer
	mu     sync.Mutex
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := strings.IndexByte(string(p.buf), '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func (p *prefixWriter) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) > 0 {
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf)
		p.buf = nil
	}
}

func envOr(name, def string) string {
	if v := strings.TrimSpace(os.Getenv(name)); v != "" {
		return v
	}
	return def
}

// redact hides a database URL's password (URL or keyword/value form).
func redact(dbURL string) string {
	if i := strings.Index(dbURL, "password="); i >= 0 && !strings.Contains(dbURL, "://") {
		end := strings.IndexByte(dbURL[i:], ' ')
		if end < 0 {
			end = len(dbURL) - i
		}
		return dbURL[:i] + "password=***" + dbURL[i+end:]
	}
	if i := strings.Index(dbURL, "://"); i >= 0 {
		rest := dbURL[i+3:]
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			if user, _, ok := strings.Cut(rest[:at], ":"); ok {
				return dbURL[:i+3] + user + ":***" + rest[at:]
			}
		}
	}
	return dbURL
}

// howTo is what devstack prints once everything answers.
type howTo struct {
	DatabaseURL, Base, GRPCAddr, HTTPAddr, OpsAddr string
	Demo                                           *Demo
	Note                                           string
	CredentialsFile, EnvFile                       string
}

func printHowTo(w io.Writer, h howTo) {
	fmt.Fprintf(w, `
Converger dev stack is up.
  core        %s  (every request is checked by the sidecar: AUTHZ_ADDR=%s)
              http://%s/metrics, /healthz, /readyz
  admin pages %s/admin/login  (the first admin comes from ADMIN_EMAIL, with ADMIN_PASSWORD or a
              generated password printed once above; emails go to the core's log unless SMTP_URL is set)
  sidecar     %s (gRPC)   http://%s/metrics
  PostgreSQL  %s
`, h.Base, h.GRPCAddr, h.OpsAddr, h.Base, h.GRPCAddr, h.HTTPAddr, h.DatabaseURL)
	if h.Demo == nil {
		fmt.Fprintf(w, "\n%s\n\nCtrl-C stops everything.\n\n", h.Note)
		return
	}
	d := h.Demo
	fmt.Fprintf(w, `
Demo tenant %q (%s) and echo channel %q (%s); development credentials, also in %s:
  API key (x-api-key, tenant API)          %s
  channel secret (tokens/generate)         %s
  publishable key (tokens/publishable)     %s

Try it from another terminal, in this directory (README.md walks through it):

  . ./%s
  B=%s
  # 1. a Converger token from the channel secret
  TOKEN=$(curl -s -X POST $B/api/v1/converger/tokens/generate -H "Authorization: Bearer $DEMO_CHANNEL_SECRET" \
    -H 'content-type: application/json' -d '{"user":{"id":"alice"}}' | sed -E 's/.*"token":"([^"]+)".*/\1/')
  # 2. a conversation; its answer carries a token bound to it
  R=$(curl -s -X POST $B/api/v1/converger/conversations -H "Authorization: Bearer $TOKEN"); echo "$R"
  CONV=$(echo "$R" | sed -E 's/.*"conversationId":"([^"]+)".*/\1/'); TOKEN=$(echo "$R" | sed -E 's/.*"token":"([^"]+)".*/\1/')
  # 3. a message
  curl -s -X POST $B/api/v1/converger/conversations/$CONV/activities -H "Authorization: Bearer $TOKEN" \
    -H 'content-type: application/json' -d '{"type":"message","from":{"id":"alice"},"text":"hello"}'; echo
  # 4. the conversation: your message and the echo channel's reply
  curl -s $B/api/v1/converger/conversations/$CONV/activities -H "Authorization: Bearer $TOKEN"; echo
  # 5. a 429 from the sidecar: publishable tokens take 10 per minute per client IP (no other step uses them)
  for i in $(seq 10); do curl -s -o /dev/null -w '%%{http_code} ' -X POST $B/api/v1/converger/tokens/publishable \
    -H "Authorization: Bearer $DEMO_PUBLISHABLE_KEY"; done; echo
  curl -si -X POST $B/api/v1/converger/tokens/publishable -H "Authorization: Bearer $DEMO_PUBLISHABLE_KEY"; echo

Management commands against this stack (DATABASE_URL, ENCRYPTION_KEY and the keys are in %s):

  . ./%s && bin/core limits show --tenant demo

Ctrl-C stops everything.

`, demoTenant, d.TenantID, demoChannel, d.ChannelID, h.CredentialsFile, d.APIKey, d.ChannelSecret, d.PublishableKey, h.CredentialsFile, h.Base,
		h.EnvFile, h.EnvFile)
}
