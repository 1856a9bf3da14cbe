// Package cmdline holds the command-line conventions every binary of the project keeps:
// -h/--help prints the usage on stdout and exits 0 without starting anything, --version
// prints the version and VCS revision the binary was built from, and an unknown flag or
// argument exits 2 with a message on stderr.
package cmdline

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// Exit codes.
const (
	OK    = 0 // done, or help and version printed
	Usage = 2 // an invalid command line
)

// revision is the VCS revision when the build info has none: `go build` in a checkout
// records it itself, a build without the repository's .git (a container build) sets it
// with -ldflags "-X github.com/converger/edge/shared/cmdline.revision=<commit>".
var revision string

// Parse parses args with fs, to which it adds --version. fs.Usage, when set, prints the
// program's usage to fs.Output(); the flag defaults follow it. exit reports that the
// program must exit now with code: after printing the usage for -h/--help (to stdout,
// code 0) or the version (code 0), or after an invalid flag or, unless positional is
// true, any argument that is not a flag (to stderr, code 2).
func Parse(fs *flag.FlagSet, args []string, positional bool, stdout, stderr io.Writer) (code int, exit bool) {
	version := fs.Bool("version", false, "print the version and the VCS revision, and exit")
	usage := fs.Usage
	fs.Usage = func() {
		if usage != nil {
			usage()
		} else {
			fmt.Fprintf(fs.Output(), "usage: %s [flags]\n", fs.Name())
		}
		fmt.Fprintln(fs.Output(), "\nflags:")
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return OK, true
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\nRun `%s --help` for its usage.\n", fs.Name(), err, fs.Name())
		return Usage, true
	case *version:
		fmt.Fprintln(stdout, Version(fs.Name()))
		return OK, true
	case !positional && fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected argument %q\nRun `%s --help` for its usage.\n", fs.Name(), fs.Arg(0), fs.Name())
		return Usage, true
	}
	return OK, false
}

// Version describes the build of program: the module version, the VCS revision and its
// time (and "modified" when the tree had uncommitted changes), and the Go version.
// For example "sidecar (devel), revision 1a2b3c4d… (2026-12-01T11:16:00Z), go1.26.8 linux/amd64".
func Version(program string) string {
	version, rev, when, modified := "(devel)", revision, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" {
			version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if rev == "" {
		rev = "unknown"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s, revision %s", program, version, rev)
	var notes []string
	if when != "" {
		notes = append(notes, when)
	}
	if modified {
		notes = append(notes, "modified")
	}
	if len(notes) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(notes, ", "))
	}
	fmt.Fprintf(&b, ", %s %s/%s", runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return b.String()
}
