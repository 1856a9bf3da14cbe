// Command core is the core API service. This version carries its database schema:
// `core migrate` applies the migrations to DATABASE_URL.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/converger/edge/core/migrations"
)

const usage = `usage: core <command>

commands:
  migrate   apply the database migrations to DATABASE_URL
`

func main() {
	if len(os.Args) != 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	switch os.Args[1] {
	case "migrate":
		url := os.Getenv("DATABASE_URL")
		if url == "" {
			fmt.Fprintln(os.Stderr, "core: DATABASE_URL is required")
			os.Exit(2)
		}
		if err := migrations.Up(ctx, url); err != nil {
			fmt.Fprintf(os.Stderr, "core: %v\n", err)
			os.Exit(1)
		}
		current, _, err := migrations.Version(ctx, url)
		if err != nil {
			fmt.Fprintf(os.Stderr, "core: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("database at schema version %d\n", current)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "core: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
}
