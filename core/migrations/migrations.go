// Package migrations holds the core's database schema as embedded SQL and applies it with goose.
// The schema belongs to the core; the sidecar only reads it.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// Up applies every pending migration. Concurrent callers (several cores starting at once)
// take turns on a PostgreSQL advisory lock.
func Up(ctx context.Context, databaseURL string) error {
	return withProvider(databaseURL, func(p *goose.Provider) error {
		_, err := p.Up(ctx)
		return err
	})
}

// Version returns the schema version of the database and the latest version known to
// this build.
func Version(ctx context.Context, databaseURL string) (current, latest int64, err error) {
	err = withProvider(databaseURL, func(p *goose.Provider) error {
		current, latest, err = p.GetVersions(ctx)
		return err
	})
	return current, latest, err
}

// withProvider opens databaseURL, runs f with a goose provider on it and closes the
// connection again.
func withProvider(databaseURL string, f func(*goose.Provider) error) error {
	// Parsed as a pool's URL, so that pool settings such as pool_max_conns, which the
	// core's pool takes from the same URL, are not sent to PostgreSQL as parameters.
	config, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		// pgx's message quotes the URL, and can only redact the password on a best-effort basis.
		return errors.New("migrations: the database URL is not a valid connection string")
	}
	db := stdlib.OpenDB(*config.ConnConfig)
	defer db.Close()
	p, err := newProvider(db)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if err := f(p); err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	return nil
}

func newProvider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, err
	}
	return goose.NewProvider(goose.DialectPostgres, db, files,
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
}
