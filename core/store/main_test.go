package store_test

import (
	"os"
	"testing"

	"github.com/converger/edge/shared/pgserver"
)

func TestMain(m *testing.M) { os.Exit(pgserver.RunTests(m)) }
