// Command devstack is what `make run` starts: a throwaway PostgreSQL under ./.data
// (unless DATABASE_URL is set), the migrations, development token keys, and the sidecar
// in the foreground. Ctrl-C stops everything.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/converger/edge/core/migrations"
	"github.com/converger/edge/shared/pgserver"
	"github.com/converger/edge/shared/token"
)

const dataDir = ".data"

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "devstack: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return err
	}
	dir, err := filepath.Abs(dataDir)
	if err != nil {
		return err
	}

	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		fmt.Println("starting a throwaway PostgreSQL under", filepath.Join(dir, "postgres"))
		pg, err := pgserver.Start(ctx, pgserver.Options{Dir: filepath.Join(dir, "postgres")})
		if err != nil {
			return err
		}
		defer pg.Stop()
		dbURL = pg.URL()
	}
	if err := migrations.Up(ctx, dbURL); err != nil {
		return err
	}

	signer, err := signingKey(filepath.Join(dir, "token_signing_key"))
	if err != nil {
		return err
	}
	demo, err := signer.Issue(token.Claims{
		TenantID:  "00000000-0000-4000-8000-000000000001",
		ChannelID: "00000000-0000-4000-8000-000000000002",
		Src:       token.SrcSecret,
	}, time.Now())
	if err != nil {
		return err
	}

	bin, err := os.Executable()
	if err != nil {
		return err
	}
	sidecar := exec.Command(filepath.Join(filepath.Dir(bin), "sidecar"))
	sidecar.Env = append(os.Environ(),
		"DATABASE_URL="+dbURL,
		"TOKEN_VERIFY_KEYS="+signer.PublicKey(),
		"LOG_FORMAT="+envOr("LOG_FORMAT", "text"),
	)
	sidecar.Stdout, sidecar.Stderr = os.Stdout, os.Stderr
	if err := sidecar.Start(); err != nil {
		return fmt.Errorf("starting the sidecar: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- sidecar.Wait() }()

	grpcAddr := envOr("SIDECAR_GRPC_ADDR", "127.0.0.1:8081")
	httpAddr := envOr("SIDECAR_HTTP_ADDR", "127.0.0.1:8082")
	fmt.Printf(howTo, dbURL, grpcAddr, demo, grpcAddr, grpcAddr, httpAddr)

	select {
	case err := <-done:
		return fmt.Errorf("the sidecar stopped: %v", err)
	case <-ctx.Done():
		_ = sidecar.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = sidecar.Process.Kill()
			<-done
		}
		fmt.Println("stopped")
		return nil
	}
}

// signingKey reads the development signing key, creating it on first start.
func signingKey(path string) (*token.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		k, err := token.GenerateKey()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(path, []byte(k+"\n"), 0o600); err != nil {
			return nil, err
		}
		b = []byte(k)
	} else if err != nil {
		return nil, err
	}
	return token.ParseSigningKey(strings.TrimSpace(string(b)))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

const howTo = `
PostgreSQL: %s
Send checks with grpcurl (go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4):

  # the legacy token endpoint allows 10 per minute per client IP; the 11th answers 429
  grpcurl -plaintext -d '{"attributes":{"source":{"address":{"socketAddress":{"address":"203.0.113.7"}}},"request":{"http":{"method":"POST","path":"/api/v1/tokens"}}}}' \
    %s envoy.service.auth.v3.Authorization/Check

  # a client-API activity, counted for the tenant of this development token
  grpcurl -plaintext -d '{"attributes":{"request":{"http":{"method":"POST","path":"/api/v1/converger/conversations/c1/activities","headers":{"authorization":"Bearer %s"}}}}}' \
    %s envoy.service.auth.v3.Authorization/Check

  # the Limiter service, as the core uses it for the login lockout
  grpcurl -plaintext -d '{"bucket":"login_ip","key":"203.0.113.7"}' %s converger.limiter.v1.Limiter/Peek

  curl -s http://%s/metrics | grep converger_

Ctrl-C stops the sidecar and PostgreSQL.
`
