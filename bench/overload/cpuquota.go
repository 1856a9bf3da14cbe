package overload

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// quotaPeriod is the period of the CPU quota: short, so that a throttled sidecar waits
// at most a few milliseconds, well inside a check's deadline.
const quotaPeriod = 10 * time.Millisecond

// limitCPU puts the process pid (all its threads) in a control group of its own whose
// CPU quota is share of one core, so that the sidecar, and not the load generator, is
// what bounds the load: a gRPC client costs about as much per call as the sidecar does
// to answer it, so a generator on one core cannot offer three times a sidecar on
// another. It uses cgroup v2 where the cpu controller is enabled, else cgroup v1's cpu
// hierarchy. remove takes the group away once the process has exited.
func limitCPU(pid int, share float64) (remove func(), err error) {
	if share <= 0 || share > 1 {
		return nil, fmt.Errorf("CPU share %g: must be above 0, at most 1", share)
	}
	name := fmt.Sprintf("converger-bench-%d", pid)
	quota := int64(share * float64(quotaPeriod/time.Microsecond))
	period := int64(quotaPeriod / time.Microsecond)
	write := func(path, v string) error { return os.WriteFile(path, []byte(v), 0) }

	var dir string
	var files [][2]string
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		dir = filepath.Join("/sys/fs/cgroup", name)
		files = [][2]string{{"cpu.max", fmt.Sprintf("%d %d", quota, period)}}
	} else if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"); err == nil {
		dir = filepath.Join("/sys/fs/cgroup/cpu", name)
		files = [][2]string{{"cpu.cfs_period_us", strconv.FormatInt(period, 10)}, {"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)}}
	} else {
		return nil, errors.New("no cgroup cpu controller under /sys/fs/cgroup (a CPU share needs cgroup v2 with cpu enabled, or v1's cpu hierarchy, and root)")
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("making the CPU control group: %w", err)
	}
	remove = func() { _ = os.Remove(dir) }
	for _, f := range files {
		if err := write(filepath.Join(dir, f[0]), f[1]); err != nil {
			remove()
			return nil, fmt.Errorf("setting %s: %w", f[0], err)
		}
	}
	if err := write(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
		remove()
		return nil, fmt.Errorf("moving the sidecar into its CPU control group: %w", err)
	}
	return remove, nil
}
