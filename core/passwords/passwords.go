// Package passwords hashes and verifies the passwords of admin and tenant users.
//
// New hashes are argon2id in the PHC string format, with their parameters inside, so
// that the parameters can be raised later without invalidating stored hashes:
//
//	$argon2id$v=19$m=19456,t=2,p=1$<salt, base64 without padding>$<hash, base64 without padding>
//
// Verify also accepts bcrypt hashes ($2a$, $2b$, $2y$), the other format CORE_API.md §1
// allows for imported accounts; NeedsRehash reports them (and argon2id hashes with
// other parameters) so that a successful login can store a fresh hash.
package passwords

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// Params are argon2id's cost parameters.
type Params struct {
	Memory  uint32 // KiB
	Time    uint32 // passes
	Threads uint8
}

// Default are the parameters of new hashes: OWASP's recommended minimum for argon2id
// (19 MiB, 2 passes, 1 lane), about 20 ms on a current server core.
var Default = Params{Memory: 19 * 1024, Time: 2, Threads: 1}

const (
	saltLen = 16
	keyLen  = 32
	// Bounds on parameters read from a stored hash, so that a tampered row cannot make
	// a login allocate gigabytes or spin for minutes.
	maxMemory  = 1 << 20 // 1 GiB in KiB
	maxTime    = 32
	maxThreads = 64
	// MaxLength bounds the passwords Hash and Verify accept, in bytes.
	MaxLength = 1024
)

// Errors of Hash and Verify.
var (
	// ErrMalformed: the stored hash is in no format this package reads.
	ErrMalformed = errors.New("passwords: malformed password hash")
	// ErrTooLong: the password is longer than MaxLength bytes.
	ErrTooLong = fmt.Errorf("passwords: a password is at most %d bytes", MaxLength)
)

// Hash returns the argon2id hash of password with Default parameters and a random salt.
func Hash(password string) (string, error) {
	return HashWith(password, Default)
}

// HashWith is Hash with explicit parameters (tests use cheap ones).
func HashWith(password string, p Params) (string, error) {
	if len(password) > MaxLength {
		return "", ErrTooLong
	}
	if err := p.check(); err != nil {
		return "", err
	}
	salt := make([]byte, saltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", fmt.Errorf("passwords: %w", err)
	}
	key := argon2.IDKey([]byte(password), salt, p.Time, p.Memory, p.Threads, keyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, p.Memory, p.Time, p.Threads,
		b64.EncodeToString(salt), b64.EncodeToString(key)), nil
}

var b64 = base64.RawStdEncoding

func (p Params) check() error {
	if p.Memory < 8*uint32(p.Threads) || p.Memory > maxMemory || p.Time < 1 || p.Time > maxTime ||
		p.Threads < 1 || p.Threads > maxThreads {
		return fmt.Errorf("passwords: argon2id parameters out of range: m=%d t=%d p=%d", p.Memory, p.Time, p.Threads)
	}
	return nil
}

// Verify reports whether password matches the stored hash, comparing in constant time.
// A wrong password is (false, nil); an error means the stored hash is unusable.
func Verify(password, encoded string) (bool, error) {
	if len(password) > MaxLength {
		return false, nil
	}
	if isBcrypt(encoded) {
		err := bcrypt.CompareHashAndPassword([]byte(encoded), []byte(password))
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, bcrypt.ErrMismatchedHashAndPassword):
			return false, nil
		default:
			return false, ErrMalformed
		}
	}
	p, salt, want, err := decode(encoded)
	if err != nil {
		return false, err
	}
	got := argon2.IDKey([]byte(password), salt, p.Time, p.Memory, p.Threads, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}

// Generate returns a random password of 24 characters (18 random bytes in base64url),
// for accounts created without one.
func Generate() string {
	b := make([]byte, 18)
	if _, err := rand.Read(b); err != nil {
		panic("crypto/rand failed: " + err.Error()) // the system is unusable
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// NeedsRehash reports whether a stored hash should be replaced by Hash's after a
// successful Verify: another format, or other parameters than Default.
func NeedsRehash(encoded string) bool {
	p, _, _, err := decode(encoded)
	return err != nil || p != Default
}

func isBcrypt(s string) bool {
	return strings.HasPrefix(s, "$2a$") || strings.HasPrefix(s, "$2b$") || strings.HasPrefix(s, "$2y$")
}

// decode reads "$argon2id$v=19$m=..,t=..,p=..$salt$hash".
func decode(encoded string) (Params, []byte, []byte, error) {
	parts := strings.Split(encoded, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" || parts[2] != "v="+strconv.Itoa(argon2.Version) {
		return Params{}, nil, nil, ErrMalformed
	}
	var p Params
	fields := strings.Split(parts[3], ",")
	if len(fields) != 3 {
		return Params{}, nil, nil, ErrMalformed
	}
	for i, name := range []string{"m=", "t=", "p="} {
		v, ok := strings.CutPrefix(fields[i], name)
		if !ok {
			return Params{}, nil, nil, ErrMalformed
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return Params{}, nil, nil, ErrMalformed
		}
		switch i {
		case 0:
			p.Memory = uint32(n)
		case 1:
			p.Time = uint32(n)
		case 2:
			if n > 255 {
				return Params{}, nil, nil, ErrMalformed
			}
			p.Threads = uint8(n)
		}
	}
	if p.check() != nil {
		return Params{}, nil, nil, ErrMalformed
	}
	salt, err := b64.DecodeString(parts[4])
	if err != nil || len(salt) < 8 || len(salt) > 64 {
		return Params{}, nil, nil, ErrMalformed
	}
	key, err := b64.DecodeString(parts[5])
	if err != nil || len(key) < 16 || len(key) > 64 {
		return Params{}, nil, nil, ErrMalformed
	}
	return p, salt, key, nil
}

// ErrBusy: no hashing slot became free within the wait (Gate).
var ErrBusy = errors.New("passwords: too many passwords are being checked at once")

// DefaultConcurrency is how many hashes a Gate computes at once when not told: one per
// CPU (argon2id is CPU-bound, so more only adds memory: 19 MiB each with Default).
func DefaultConcurrency() int { return runtime.GOMAXPROCS(0) }

// DefaultWait is how long a Gate lets a hash wait for a slot.
const DefaultWait = 5 * time.Second

// Gate bounds the password hashes computed at once (PASSWORD_HASH_CONCURRENCY), so that
// a flood of logins cannot make the process hold one argon2id's memory per request: a
// hash waits for a slot, at most the wait, and is then refused with ErrBusy. The zero
// value is not usable; call NewGate. A nil *Gate does not bound anything.
type Gate struct {
	slots chan struct{}
	wait  time.Duration
	peak  atomic.Int32
	busy  atomic.Int32
}

// NewGate returns a gate of n slots (DefaultConcurrency when n <= 0) whose hashes wait
// at most wait for a slot (DefaultWait when wait <= 0).
func NewGate(n int, wait time.Duration) *Gate {
	if n <= 0 {
		n = DefaultConcurrency()
	}
	if wait <= 0 {
		wait = DefaultWait
	}
	return &Gate{slots: make(chan struct{}, n), wait: wait}
}

// Size returns how many hashes run at once at most.
func (g *Gate) Size() int { return cap(g.slots) }

// Peak returns the most hashes that ran at once.
func (g *Gate) Peak() int { return int(g.peak.Load()) }

// do runs f in a slot.
func (g *Gate) do(ctx context.Context, f func()) error {
	if g == nil {
		f()
		return nil
	}
	t := time.NewTimer(g.wait)
	defer t.Stop()
	select {
	case g.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return ErrBusy
	}
	n := g.busy.Add(1)
	for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
	}
	defer func() { g.busy.Add(-1); <-g.slots }()
	f()
	return nil
}

// Verify is Verify in a slot of the gate: ErrBusy (or ctx's error) when none came free.
func (g *Gate) Verify(ctx context.Context, password, encoded string) (ok bool, err error) {
	if werr := g.do(ctx, func() { ok, err = Verify(password, encoded) }); werr != nil {
		return false, werr
	}
	return ok, err
}

// Hash is HashWith in a slot of the gate.
func (g *Gate) Hash(ctx context.Context, password string, p Params) (hash string, err error) {
	if werr := g.do(ctx, func() { hash, err = HashWith(password, p) }); werr != nil {
		return "", werr
	}
	return hash, err
}
