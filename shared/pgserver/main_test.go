package pgserver

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(RunTests(m)) }
