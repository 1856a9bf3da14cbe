// Package envfile lets any setting of the project's binaries be given as a file:
// NAME_FILE=/path holds the value of NAME. Keys and database URLs can then come from a
// Docker volume, a Kubernetes Secret mounted as files or systemd's credentials, rather
// than from the environment, where every process of the user can read them.
package envfile

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode/utf8"
)

// Suffix marks a variable that names the file holding another one's value.
const Suffix = "_FILE"

// MaxSize bounds a value file: settings are short, and a device or a log named by mistake
// must not be read whole.
const MaxSize = 64 << 10

// Env is an environment in which NAME, when NAME_FILE is set, is the content of that file
// without its trailing newline. A file is read when its variable is first asked for, so
// that unrelated *_FILE variables of the environment (SSL_CERT_FILE, say) are left alone.
type Env struct {
	env      map[string]string
	readFile func(string) ([]byte, error)

	mu   sync.Mutex
	read map[string]string
	errs []error
}

// New returns the environment of environ (os.Environ()), reading files with readFile
// (os.ReadFile).
func New(environ []string, readFile func(string) ([]byte, error)) *Env {
	e := &Env{env: make(map[string]string, len(environ)), readFile: readFile, read: map[string]string{}}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		e.env[k] = v
	}
	return e
}

// Getenv returns the value of name: the variable itself, or the content of the file that
// name_FILE names. A file that cannot be used (unreadable, larger than MaxSize, not UTF-8,
// or set together with name) gives "" and is reported by Err.
func (e *Env) Getenv(name string) string {
	path := e.env[name+Suffix]
	if strings.TrimSpace(path) == "" {
		return e.env[name]
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if v, ok := e.read[name]; ok {
		return v
	}
	v, err := e.load(name, path)
	if err != nil {
		e.errs = append(e.errs, err)
	}
	e.read[name] = v
	return v
}

func (e *Env) load(name, path string) (string, error) {
	file := name + Suffix
	if strings.TrimSpace(e.env[name]) != "" {
		return "", fmt.Errorf("%s and %s are both set: set one of them", name, file)
	}
	b, err := e.readFile(path)
	switch {
	case err != nil:
		return "", fmt.Errorf("%s: %w", file, err)
	case len(b) > MaxSize:
		return "", fmt.Errorf("%s: %s is larger than %d bytes", file, path, MaxSize)
	case !utf8.Valid(b):
		return "", fmt.Errorf("%s: %s is not UTF-8 text", file, path)
	}
	return strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), nil
}

// Err reports the files that could not be used among those read so far.
func (e *Env) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return errors.Join(e.errs...)
}
