package gctune

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

var keep [][]byte

// After each collection GOGC follows the live heap: headroom / live, within its bounds.
func TestPercentFollowsTheLiveHeap(t *testing.T) {
	if os.Getenv("GOGC") != "" {
		t.Skip("GOGC is set: the tuner leaves it")
	}
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	tu := Start(64 << 20)
	if tu == nil {
		t.Fatal("Start did nothing without GOGC set")
	}
	defer tu.Stop()
	waitPercent := func(ok func(int) bool) int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
			p := tu.Percent()
			if ok(p) || time.Now().After(deadline) {
				return p
			}
		}
	}
	// A small live heap: far more than Go's default.
	if p := waitPercent(func(p int) bool { return p >= 1000 }); p < 1000 {
		t.Fatalf("GOGC %d with a live heap of a few MB and 64 MiB of headroom", p)
	}
	// A live heap of 256 MiB, beyond the headroom: Go's default.
	for range 256 {
		keep = append(keep, make([]byte, 1<<20))
	}
	if p := waitPercent(func(p int) bool { return p == MinPercent }); p != MinPercent {
		t.Fatalf("GOGC %d with a live heap of 256 MiB, want %d", p, MinPercent)
	}
	if got := debug.SetGCPercent(MinPercent); got != MinPercent {
		t.Fatalf("the runtime's GOGC is %d, the tuner's %d", got, MinPercent)
	}
	keep = nil
	if p := waitPercent(func(p int) bool { return p >= 1000 }); p < 1000 {
		t.Fatalf("GOGC %d after the live heap shrank back", p)
	}
}

// GOGC in the environment is the operator's: Start leaves it.
func TestGOGCInTheEnvironmentStands(t *testing.T) {
	if os.Getenv("GCTUNE_CHILD") == "1" {
		if Start(64<<20) != nil || debug.SetGCPercent(50) != 50 {
			os.Exit(3)
		}
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestGOGCInTheEnvironmentStands$")
	cmd.Env = append(os.Environ(), "GCTUNE_CHILD=1", "GOGC=50")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("with GOGC=50 the tuner changed it: %v\n%s", err, out)
	}
}

// Before the first collection the live heap reads 0: the tuner takes it as LiveFloor, so
// that the first collection comes within the headroom (not at 4 MiB × 101).
func TestFirstCollectionWithinTheHeadroom(t *testing.T) {
	if os.Getenv("GCTUNE_CHILD") == "floor" {
		tu := Start(64 << 20)
		if want := 64 * 100 / 4; tu.Percent() != want {
			fmt.Fprintf(os.Stderr, "GOGC %d before the first collection, want %d\n", tu.Percent(), want)
			os.Exit(3)
		}
		// 256 MiB allocated in 1 MiB pieces, none kept: with the live heap taken as 0
		// (GOGC 10,000) no collection would come before about 404 MiB.
		for range 256 {
			keep = append(keep[:0], make([]byte, 1<<20))
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.NumGC == 0 {
			fmt.Fprintln(os.Stderr, "no collection after 256 MiB allocated with 64 MiB of headroom")
			os.Exit(4)
		}
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFirstCollectionWithinTheHeadroom$")
	cmd.Env = append(os.Environ(), "GCTUNE_CHILD=floor")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("a fresh process: %v\n%s", err, out)
	}
}
