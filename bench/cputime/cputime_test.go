package cputime

import (
	"os"
	"testing"
	"time"
)

func TestCPUTime(t *testing.T) {
	before, err := Process(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self0, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	m0, err := Machine()
	if err != nil {
		t.Fatal(err)
	}
	// Spin until this process has used 100ms of CPU (or 10s have passed, on a machine too
	// busy to give it that).
	x := 0
	for start := time.Now(); time.Since(start) < 10*time.Second; x++ {
		if x%1024 == 0 {
			if now, _ := Self(); now-self0 >= 100*time.Millisecond {
				break
			}
		}
	}
	self1, _ := Self()
	after, _ := Process(os.Getpid())
	m1, _ := Machine()
	if used := self1 - self0; used < 100*time.Millisecond {
		t.Skipf("the machine gave this test only %v of CPU in 10s", used)
	}
	// /proc counts in 10ms ticks.
	if used, self := after-before, self1-self0; used < self-30*time.Millisecond || used > self+30*time.Millisecond {
		t.Errorf("Process went up by %v while getrusage counted %v", used, self)
	}
	if used := m1 - m0; used < self1-self0-30*time.Millisecond {
		t.Errorf("Machine went up by %v, less than this process alone (%v)", used, self1-self0)
	}
	if _, err := Process(-1); err == nil {
		t.Error("Process(-1) should fail")
	}
}
