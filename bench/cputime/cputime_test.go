package cputime

import (
	"os"
	"os/exec"
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

// A process's tree counts its children, alive and exited.
func TestTree(t *testing.T) {
	if mode := os.Getenv("CPUTIME_TEST_CHILD"); mode != "" {
		// A child: use 150ms of CPU, then exit or stay.
		self0, _ := Self()
		for start := time.Now(); time.Since(start) < 10*time.Second; {
			if now, _ := Self(); now-self0 >= 150*time.Millisecond {
				break
			}
		}
		if mode == "stay" {
			time.Sleep(time.Minute)
		}
		os.Exit(0)
	}
	child := func(mode string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTree$")
		cmd.Env = append(os.Environ(), "CPUTIME_TEST_CHILD="+mode)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	own0, _ := Process(os.Getpid())
	tree0, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := child("exit").Wait(); err != nil {
		t.Fatal(err)
	}
	stay := child("stay")
	defer func() { _ = stay.Process.Kill(); _ = stay.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if used, _ := Process(stay.Process.Pid); used >= 120*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Skip("the machine gave the child too little CPU")
		}
	}
	own1, _ := Process(os.Getpid())
	tree1, err := Tree(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Both children's 150ms, less the rounding of /proc's 10ms ticks, beside this process's own.
	if children := (tree1 - tree0) - (own1 - own0); children < 250*time.Millisecond {
		t.Errorf("the tree counted %v of its children's CPU, want at least 2 × 150ms", children)
	}
	if _, err := Tree(-1); err == nil {
		t.Error("Tree(-1) should fail")
	}
}
