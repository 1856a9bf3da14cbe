//go:build linux

package browsertest

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel kill the child when the thread that started it
// ends, so that the child never outlives the test binary.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
