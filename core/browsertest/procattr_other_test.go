//go:build !linux

package browsertest

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death signal; the
// test's cleanup kills the child.
func setParentDeathSignal(*exec.Cmd) {}
