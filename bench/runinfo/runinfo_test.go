package runinfo

import (
	"strings"
	"testing"
)

func TestCommand(t *testing.T) {
	got := Command("cluster", []string{"-n", "3,5", "-out", "it's here"})
	want := "./bin/bench cluster -n 3,5 -out 'it'\\''s here'"
	if !strings.HasSuffix(got, want) || !strings.HasPrefix(got, "go build -o bin/sidecar ") {
		t.Errorf("Command = %q, want … %q", got, want)
	}
	if ShellQuote("") != "''" || ShellQuote("a b") != "'a b'" || ShellQuote("-quick") != "-quick" {
		t.Error("ShellQuote")
	}
	if Verdict(true) != "PASS" || Verdict(false) != "FAIL" {
		t.Error("Verdict")
	}
}
