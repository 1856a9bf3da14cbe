package authzload

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// Seed inserts the population's tenants and channels with COPY, storing the SHA-256 of each
// credential as the core does. Secret ciphertexts are random bytes: the sidecar never reads
// them.
func Seed(ctx context.Context, databaseURL string, p *Population) error {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	tenants := make([][]any, len(p.Tenants))
	for i, t := range p.Tenants {
		tenants[i] = []any{t.ID, "bench-tenant-" + strconv.Itoa(i), sha256Of(t.APIKey), t.APIKey[:13]}
	}
	channels := make([][]any, len(p.Channels))
	for j, c := range p.Channels {
		var pk any // NULL
		if c.Publishable != "" {
			pk = sha256Of(c.Publishable)
		}
		typ := "webhook"
		if j%4 == 0 {
			typ = "echo"
		}
		channels[j] = []any{c.ID, p.Tenants[c.Tenant].ID, "channel-" + strconv.Itoa(j), typ,
			sha256Of(c.Secret), sha256Of("sealed:" + c.Secret), pk}
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }() // a no-op after Commit
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"tenants"},
		[]string{"id", "name", "api_key_hash", "api_key_prefix"}, pgx.CopyFromRows(tenants)); err != nil {
		return fmt.Errorf("seed tenants: %w", err)
	}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"channels"},
		[]string{"id", "tenant_id", "name", "type", "secret_hash", "secret_ciphertext", "publishable_key_hash"},
		pgx.CopyFromRows(channels)); err != nil {
		return fmt.Errorf("seed channels: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	// Fresh statistics, so that lookups by hash use the indexes from the first query on.
	if _, err := conn.Exec(ctx, "ANALYZE tenants; ANALYZE channels"); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	return nil
}
