package directlinetest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/api"
	"github.com/converger/edge/core/credentials"
	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/core/store"
	"github.com/converger/edge/shared/npmci"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }

// TestDirectLineClient runs directline.mjs: the Direct Line client in polling and in
// WebSocket mode posts a message and receives its echo, uploads a file, refreshes its
// token and resumes the conversation by id and watermark without loss or duplicates.
func TestDirectLineClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is needed to run the Direct Line client (Debian: apt-get install nodejs npm)")
	}
	npmci.Install(t, ".")

	base, secret := startCore(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "directline.mjs")
	cmd.Env = append(os.Environ(), "BASE="+base, "SECRET="+secret)
	out, err := cmd.CombinedOutput()
	t.Logf("directline.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("the Direct Line client failed: %v", err)
	}
}

// startCore serves a core on loopback over a fresh database and returns its base URL
// and the secret of an echo channel.
func startCore(t *testing.T) (base, secret string) {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgserver.NewTestDatabase(t, migrations.Up))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	sealer, err := credentials.ParseEncryptionKey(credentials.GenerateEncryptionKey())
	if err != nil {
		t.Fatal(err)
	}
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	signer, err := token.ParseSigningKey(key)
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := token.ParseVerifyKeys(signer.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(pool, sealer, activity.DefaultLimits)
	tenant, _, err := st.As("test").CreateTenant(ctx, "directline")
	if err != nil {
		t.Fatal(err)
	}
	_, secrets, err := st.As("test").CreateChannel(ctx, tenant.ID, "echo", "echo", "duplex")
	if err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base = "http://" + ln.Addr().String()
	app, listener := api.New(api.Deps{Store: st, Signer: signer, Verifier: verifier, PublicURL: base,
		Limits: activity.DefaultLimits, MaxUploadBytes: 1 << 20, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	lctx, stop := context.WithCancel(ctx)
	go listener.Run(lctx)
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() {
		stop()
		_ = app.ShutdownWithTimeout(5 * time.Second)
	})
	return base, secrets.Secret
}
