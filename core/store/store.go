// Package store is the core's data in PostgreSQL (pgx): tenants, channels, conversations,
// activities and attachments, with the one trusted function that creates activities.
package store

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/converger/edge/core/activity"
	"github.com/converger/edge/core/credentials"
)

// Errors the API maps to its statuses.
var (
	// ErrNotFound: no such row for this tenant (another tenant's rows look the same).
	ErrNotFound = errors.New("not found")
	// ErrConversationClosed: the conversation refuses writes.
	ErrConversationClosed = errors.New("conversation closed")
	// ErrConflict: a unique value is taken (a name, for instance).
	ErrConflict = errors.New("already exists")
)

// Store is the core's database.
type Store struct {
	pool   *pgxpool.Pool
	sealer *credentials.Sealer // nil: channel secrets cannot be created or read back
	limits activity.Limits
}

// New returns a store over pool. sealer encrypts channel secrets (ENCRYPTION_KEY).
func New(pool *pgxpool.Pool, sealer *credentials.Sealer, limits activity.Limits) *Store {
	return &Store{pool: pool, sealer: sealer, limits: limits}
}

// Pool is the store's connection pool.
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// inTx runs f in a transaction, committed when f returns nil.
func (s *Store) inTx(ctx context.Context, f func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, s.pool, f)
}

func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}
