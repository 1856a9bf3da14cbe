package pgserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"

	"github.com/converger/edge/shared/debpkg"
)

type binaries struct{ initdb, postgres string }

// installMu keeps parallel tests of one binary from running apt-get at the same time.
var installMu sync.Mutex

// findBinaries looks for initdb and postgres in binDir if given; else on PATH, then in the
// newest /usr/lib/postgresql/*/bin, installing Debian's postgresql package if root.
func findBinaries(ctx context.Context, binDir string, logf func(string, ...any)) (binaries, error) {
	if binDir != "" {
		b := binaries{filepath.Join(binDir, "initdb"), filepath.Join(binDir, "postgres")}
		if !debpkg.IsExecutable(b.initdb) || !debpkg.IsExecutable(b.postgres) {
			return binaries{}, fmt.Errorf("pgserver: initdb and postgres not found in %s", binDir)
		}
		return b, nil
	}
	if b, ok := searchBinaries(); ok {
		return b, nil
	}
	if os.Geteuid() != 0 {
		return binaries{}, errors.New("pgserver: PostgreSQL is not installed (no initdb and postgres on PATH or under /usr/lib/postgresql/*/bin); " +
			"install it (e.g. sudo apt-get install postgresql) or set DATABASE_URL to an existing server")
	}
	installMu.Lock()
	defer installMu.Unlock()
	if b, ok := searchBinaries(); ok {
		return b, nil
	}
	if logf != nil {
		logf("pgserver: PostgreSQL not found")
	}
	if err := debpkg.Install(ctx, logf, "postgresql"); err != nil {
		return binaries{}, fmt.Errorf("pgserver: %w", err)
	}
	if b, ok := searchBinaries(); ok {
		return b, nil
	}
	return binaries{}, errors.New("pgserver: installed the postgresql package but still found no initdb and postgres")
}

func searchBinaries() (binaries, bool) {
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err1 == nil && err2 == nil {
		return binaries{initdb, postgres}, true
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) float64 {
		v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(dir)), 64) // "15", "9.6"
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return cmp.Compare(version(b), version(a)) }) // newest first
	for _, dir := range dirs {
		b := binaries{filepath.Join(dir, "initdb"), filepath.Join(dir, "postgres")}
		if debpkg.IsExecutable(b.initdb) && debpkg.IsExecutable(b.postgres) {
			return b, true
		}
	}
	return binaries{}, false
}
