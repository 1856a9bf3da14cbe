package deploy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	coreconfig "github.com/converger/edge/core/config"
	"github.com/converger/edge/core/manage"
	"github.com/converger/edge/shared/envfile"
	sidecarconfig "github.com/converger/edge/sidecar/config"
)

// container is one container of the deployment as the checks see it: the program its
// image runs, the arguments, its environment, and where its mounts are on this machine.
type container struct {
	where   string // "service core-1", "deployment converger container core"
	program string // "core", "sidecar", or "" for other images
	args    []string
	env     map[string]string
	mounts  map[string]string // container path -> directory or file here
	// indirect are variables only other values refer to ($(POD_IP) in Kubernetes).
	indirect map[string]bool
}

// hostPath maps a path in the container to this machine through the mounts; other
// values are returned as they are.
func (c *container) hostPath(p string) string {
	if !strings.HasPrefix(p, "/") {
		return p
	}
	best := ""
	for target := range c.mounts {
		if (p == target || strings.HasPrefix(p, strings.TrimSuffix(target, "/")+"/")) && len(target) > len(best) {
			best = target
		}
	}
	if best == "" {
		return p
	}
	return filepath.Join(c.mounts[best], strings.TrimPrefix(p, best))
}

// programOf is the program an image runs: the core or the sidecar of deploy/Dockerfile
// (by build target or by the image's name), else "".
func programOf(image, target string) string {
	if target != "" {
		return target
	}
	repo := image
	if i := strings.LastIndexAny(repo, ":@"); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i]
	}
	switch path.Base(repo) {
	case "core", "sidecar":
		return path.Base(repo)
	}
	return ""
}

// checkConfig loads the configuration c's program would load at start, with c's
// environment (NAME_FILE read through the mounts; values that are paths in the container
// translated too), exactly as its main does, and reports an error the program would stop
// with, and every variable c sets that the program never reads. The set of known
// variables is thus the binaries' own config code, not a list here.
func checkConfig(c *container) []error {
	environ := make([]string, 0, len(c.env))
	for k, v := range c.env {
		environ = append(environ, k+"="+c.hostPath(v))
	}
	env := envfile.New(environ, os.ReadFile)
	read := map[string]bool{}
	getenv := func(name string) string {
		read[name] = true
		return env.Getenv(name)
	}
	var err error
	cmd := ""
	if len(c.args) > 0 {
		cmd = c.args[0]
	}
	switch {
	case c.program == "sidecar" && len(c.args) == 0:
		_, err = sidecarconfig.Load(getenv)
	case c.program == "core" && (cmd == "serve" || cmd == "migrate"):
		var cfg *coreconfig.Config
		if cfg, err = coreconfig.Load(getenv); err == nil && cmd == "serve" {
			err = cfg.RequireServe()
		} else if err == nil && cfg.DatabaseURL == "" {
			err = fmt.Errorf("DATABASE_URL is required to migrate")
		}
	case c.program == "core" && cmd == "keys":
		args := make([]string, len(c.args))
		for i, a := range c.args {
			args[i] = c.hostPath(a)
		}
		var stderr bytes.Buffer
		if code := manage.Run(context.Background(), args, manage.Env{Getenv: getenv}, &bytes.Buffer{}, &stderr); code != 0 {
			err = fmt.Errorf("core %s: exit %d: %s", strings.Join(c.args, " "), code, stderr.String())
		}
	default:
		return []error{fmt.Errorf("%s: runs %s %v, which these checks do not know how to check", c.where, c.program, c.args)}
	}
	var errs []error
	if ferr := env.Err(); ferr != nil {
		err = ferr
	}
	if err != nil {
		// What it did not read after the error says nothing.
		return append(errs, fmt.Errorf("%s: %s %s would not start: %v", c.where, c.program, strings.Join(c.args, " "), err))
	}
	var unread []string
	for k := range c.env {
		if !read[k] && !c.indirect[k] && !(strings.HasSuffix(k, envfile.Suffix) && read[strings.TrimSuffix(k, envfile.Suffix)]) {
			unread = append(unread, k)
		}
	}
	sort.Strings(unread)
	for _, k := range unread {
		errs = append(errs, fmt.Errorf("%s: %s is not a variable %s reads (a typo, or one it does not know)", c.where, k, c.program))
	}
	return errs
}
