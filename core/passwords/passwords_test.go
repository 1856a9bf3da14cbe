package passwords

import (
	"context"
	"encoding/base64"
	"errors"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

var cheap = Params{Memory: 64, Time: 1, Threads: 1}

func TestHashFormatAndVerify(t *testing.T) {
	h, err := Hash("correct horse battery staple")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^\$argon2id\$v=19\$m=19456,t=2,p=1\$[A-Za-z0-9+/]{22}\$[A-Za-z0-9+/]{43}$`).MatchString(h) {
		t.Fatalf("hash %q is not in the PHC format with the default parameters", h)
	}
	if strings.Contains(h, "horse") {
		t.Fatal("hash contains the password")
	}
	if ok, err := Verify("correct horse battery staple", h); !ok || err != nil {
		t.Fatalf("Verify(right) = %v, %v", ok, err)
	}
	for _, wrong := range []string{"", "correct horse battery stapl", "correct horse battery staple ", "Correct horse battery staple"} {
		if ok, err := Verify(wrong, h); ok || err != nil {
			t.Errorf("Verify(%q) = %v, %v", wrong, ok, err)
		}
	}
	h2, _ := Hash("correct horse battery staple")
	if h2 == h {
		t.Fatal("two hashes of one password are equal: the salt is not random")
	}
	if NeedsRehash(h) {
		t.Error("a default hash needs no rehash")
	}
}

// TestVerifyReadsParameters: the parameters come from the stored string, not from Default,
// and the hash equals argon2id computed independently with them.
func TestVerifyReadsParameters(t *testing.T) {
	h, err := HashWith("pw", cheap)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(h, "$argon2id$v=19$m=64,t=1,p=1$") {
		t.Fatalf("hash %q", h)
	}
	if ok, err := Verify("pw", h); !ok || err != nil {
		t.Fatalf("Verify = %v, %v", ok, err)
	}
	if !NeedsRehash(h) {
		t.Error("a hash with other parameters needs a rehash")
	}
	parts := strings.Split(h, "$")
	salt, _ := base64.RawStdEncoding.DecodeString(parts[4])
	want := base64.RawStdEncoding.EncodeToString(argon2.IDKey([]byte("pw"), salt, 1, 64, 1, 32))
	if parts[5] != want {
		t.Fatalf("stored key %s, argon2id gives %s", parts[5], want)
	}
}

func TestVerifyBcrypt(t *testing.T) {
	b, err := bcrypt.GenerateFromPassword([]byte("legacy pass"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := Verify("legacy pass", string(b)); !ok || err != nil {
		t.Fatalf("Verify(bcrypt) = %v, %v", ok, err)
	}
	if ok, err := Verify("legacy pas", string(b)); ok || err != nil {
		t.Fatalf("Verify(bcrypt, wrong) = %v, %v", ok, err)
	}
	if !NeedsRehash(string(b)) {
		t.Error("bcrypt hashes need a rehash")
	}
}

func TestMalformed(t *testing.T) {
	good, _ := HashWith("pw", cheap)
	parts := strings.Split(good, "$")
	for _, h := range []string{
		"",
		"pw",
		"$argon2i$v=19$m=64,t=1,p=1$" + parts[4] + "$" + parts[5],
		"$argon2id$v=16$m=64,t=1,p=1$" + parts[4] + "$" + parts[5],
		"$argon2id$v=19$m=64,t=1$" + parts[4] + "$" + parts[5],
		"$argon2id$v=19$t=1,m=64,p=1$" + parts[4] + "$" + parts[5],
		"$argon2id$v=19$m=99999999,t=1,p=1$" + parts[4] + "$" + parts[5], // a tampered row asking for 95 GiB
		"$argon2id$v=19$m=64,t=1000,p=1$" + parts[4] + "$" + parts[5],
		"$argon2id$v=19$m=64,t=1,p=0$" + parts[4] + "$" + parts[5],
		"$argon2id$v=19$m=64,t=1,p=1$!!$" + parts[5],
		"$argon2id$v=19$m=64,t=1,p=1$" + parts[4] + "$",
		"$argon2id$v=19$m=64,t=1,p=1$" + parts[4] + "$" + parts[5] + "$x",
		"$2b$04$tooshort",
	} {
		if ok, err := Verify("pw", h); ok || !errors.Is(err, ErrMalformed) {
			t.Errorf("Verify(%q) = %v, %v; want ErrMalformed", h, ok, err)
		}
		if !NeedsRehash(h) {
			t.Errorf("NeedsRehash(%q) = false", h)
		}
	}
}

func TestLengthAndParams(t *testing.T) {
	long := strings.Repeat("x", MaxLength+1)
	if _, err := Hash(long); !errors.Is(err, ErrTooLong) {
		t.Errorf("Hash(too long) error %v", err)
	}
	h, _ := HashWith(strings.Repeat("x", MaxLength), cheap)
	if ok, err := Verify(long, h); ok || err != nil {
		t.Errorf("Verify(too long) = %v, %v", ok, err)
	}
	if _, err := HashWith("pw", Params{Memory: 0, Time: 1, Threads: 1}); err == nil {
		t.Error("HashWith accepted m=0")
	}
}

func TestGenerate(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		p := Generate()
		if !regexp.MustCompile(`^[A-Za-z0-9_-]{24}$`).MatchString(p) || seen[p] {
			t.Fatalf("Generate() = %q (seen before: %v)", p, seen[p])
		}
		seen[p] = true
	}
}

// A gate runs at most its size of hashes at once, and refuses a hash that waits longer
// than its wait.
func TestGateBoundsConcurrentHashes(t *testing.T) {
	hash, err := HashWith("secret-password", cheap)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGate(2, time.Minute)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if ok, err := g.Verify(context.Background(), "secret-password", hash); !ok || err != nil {
				t.Errorf("verify: %v %v", ok, err)
			}
		})
	}
	wg.Wait()
	if g.Peak() < 1 || g.Peak() > 2 {
		t.Fatalf("peak %d hashes at once, want at most 2", g.Peak())
	}

	// A gate whose only slot is held refuses after its wait.
	busy := NewGate(1, 20*time.Millisecond)
	busy.slots <- struct{}{}
	if _, err := busy.Verify(context.Background(), "x", hash); !errors.Is(err, ErrBusy) {
		t.Fatalf("full gate: %v, want ErrBusy", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := busy.Hash(ctx, "x", cheap); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	var none *Gate
	if ok, err := none.Verify(context.Background(), "secret-password", hash); !ok || err != nil {
		t.Fatalf("nil gate: %v %v", ok, err)
	}
}
