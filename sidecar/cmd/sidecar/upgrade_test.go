package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// previousRelease is the commit of the release before the compressed sync messages
// (version 3): its sidecar announces and speaks version 2.
const previousRelease = "8264583e78f9e2524fd2c14440a9515e04189aaf"

// previousSidecar returns the previous release's sidecar: SIDECAR_PREVIOUS_BINARY, or
// built from the repository's history (cached by Go's build cache after the first time).
func previousSidecar(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SIDECAR_PREVIOUS_BINARY"); p != "" {
		return p
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("no git checkout to build the previous release from (set SIDECAR_PREVIOUS_BINARY): %v", err)
	}
	top := strings.TrimSpace(string(root))
	if err := exec.Command("git", "-C", top, "cat-file", "-e", previousRelease+"^{commit}").Run(); err != nil {
		t.Skipf("the previous release %s is not in this clone's history (set SIDECAR_PREVIOUS_BINARY)", previousRelease[:7])
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive %s | tar -x -C %q", top, previousRelease, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("extracting %s: %v\n%s", previousRelease[:7], err, out)
	}
	bin := filepath.Join(dir, "sidecar-previous")
	build := exec.Command("go", "build", "-o", bin, "./sidecar/cmd/sidecar")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the previous release: %v\n%s", err, out)
	}
	return bin
}

// TestClusterRollingUpgradeKeepsMerging runs the previous release's sidecar beside two of
// this one: the new nodes send each other compressed messages (version 3) and the old
// one version 2, and every node counts every node's hits exactly once; every node's live
// view holds every node's decisions.
func TestClusterRollingUpgradeKeepsMerging(t *testing.T) {
	t.Parallel()
	old := previousSidecar(t)
	path := writeTemp(t, "limits.yaml", hourLimits)
	ports := []int{freePort(t), freePort(t), freePort(t)}
	offset := clockOffset(time.Hour)
	var nodes []*node
	t.Cleanup(func() { terminate(t, nodes...) })
	for i := range 3 {
		name := fmt.Sprintf("n%d", i+1)
		env := nodeEnv(name, ports[i], ports, path, offset)
		bin := binary
		if i == 0 {
			bin = old
		}
		n := startNodeClients(t, "", startBinary(t, "", bin, env))
		n.name, n.env = name, env
		nodes = append(nodes, n)
	}
	waitMembers(t, nodes, names(nodes), 20*time.Second)

	const bucket, key = "password_reset_ip", "198.51.100.77"
	hits := []uint32{3, 4, 2}
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			for range hits[i] {
				if _, err := func() (any, error) {
					ctx, cancel := n.ctx()
					defer cancel()
					return n.limiter.Record(ctx, bucket, key, 1)
				}(); err != nil {
					t.Errorf("%s: Record: %v", n.name, err)
					return
				}
				time.Sleep(30 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	state := func() (bool, string) {
		var s []string
		ok := true
		for _, n := range nodes {
			d, p := n.debug(bucket, key), n.peek(bucket, key)
			s = append(s, fmt.Sprintf("%s: own %d remote %d peek %d", n.name, d.Own, d.Remote, p.Count))
			ok = ok && d.Own+d.Remote == 9 && p.Count == 9
		}
		return ok, strings.Join(s, "; ")
	}
	eventually(t, 5*time.Second, "every node, old and new, counts 3+4+2", state)
	time.Sleep(5 * syncInterval)
	if ok, s := state(); !ok {
		t.Fatalf("the totals moved once quiet: %s", s)
	}
	// The live view across versions: the new nodes ask each other for their minute
	// counts and send theirs to the old one unasked, which sends its own to everyone;
	// every node's view holds every node's decision. No query reaches the old node
	// (it would count it as malformed, below).
	const viewBucket = "token_create"
	for _, n := range nodes {
		if r := n.check(viewBucket, "198.51.100.78"); !r.Allowed {
			t.Fatalf("%s: the check for the live view was refused: %+v", n.name, r)
		}
	}
	for _, n := range nodes {
		eventually(t, 15*time.Second, n.name+"'s live view holds every node's decision", func() (bool, string) {
			ctx, cancel := n.ctx()
			defer cancel()
			tr, err := n.limiter.Traffic(ctx)
			if err != nil {
				return false, err.Error()
			}
			var decided uint64
			for _, b := range tr.GetBuckets() {
				if b.GetBucket() == viewBucket {
					for _, m := range b.GetMinutes() {
						decided += m.GetAllowed() + m.GetDenied()
					}
				}
			}
			return tr.GetNodes() == 3 && decided == 3, fmt.Sprintf("%d nodes, %d decisions", tr.GetNodes(), decided)
		})
	}
	for _, n := range nodes[1:] {
		if m := n.metric("converger_cluster_malformed_messages_total"); m != 0 {
			t.Errorf("%s: %v malformed messages", n.name, m)
		}
	}
	if m := nodes[0].metric("converger_cluster_malformed_messages_total"); m != 0 {
		t.Errorf("the previous release got %v messages it could not read", m)
	}
}
