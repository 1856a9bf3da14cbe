package inbound

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	testSecret = []byte("0123456789abcdef0123456789abcdef0123456789a")
	testBody   = []byte(`{"text":"hello","idempotency_key":"wamid.1"}`)
	testNow    = time.Unix(1_800_000_000, 0)
)

// hmacHex is the reference signature, computed independently of Sign.
func hmacHex(secret []byte, t int64, body []byte) string {
	h := hmac.New(sha256.New, secret)
	fmt.Fprintf(h, "%d.%s", t, body)
	return hex.EncodeToString(h.Sum(nil))
}

func TestSignMatchesTheDocumentedConstruction(t *testing.T) {
	want := "t=1800000000,v1=" + hmacHex(testSecret, 1_800_000_000, testBody)
	if got := Sign(testNow, testBody, testSecret); got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	if err := Verify(want, testSecret, testBody, testNow); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	ts := testNow.Unix()
	valid := hmacHex(testSecret, ts, testBody)
	other := hmacHex([]byte("another secret"), ts, testBody)
	header := func(t int64, v1 ...string) string {
		h := "t=" + strconv.FormatInt(t, 10)
		for _, v := range v1 {
			h += ",v1=" + v
		}
		return h
	}
	cases := []struct {
		name   string
		header string
		secret []byte
		body   []byte
		want   error
	}{
		{"valid", header(ts, valid), testSecret, testBody, nil},
		{"valid, upper-case hex", header(ts, strings.ToUpper(valid)), testSecret, testBody, nil},
		{"v1 before t", "v1=" + valid + ",t=" + strconv.FormatInt(ts, 10), testSecret, testBody, nil},
		{"wrong key", header(ts, valid), []byte("another secret"), testBody, ErrMismatch},
		{"tampered body", header(ts, valid), testSecret, append(bytes.Clone(testBody), ' '), ErrMismatch},
		{"empty body signed, body sent", header(ts, hmacHex(testSecret, ts, nil)), testSecret, testBody, ErrMismatch},
		{"signed with another t", header(ts+1, valid), testSecret, testBody, ErrMismatch},
		{"300 s old", header(ts-300, hmacHex(testSecret, ts-300, testBody)), testSecret, testBody, nil},
		{"300 s ahead", header(ts+300, hmacHex(testSecret, ts+300, testBody)), testSecret, testBody, nil},
		{"301 s old", header(ts-301, hmacHex(testSecret, ts-301, testBody)), testSecret, testBody, ErrStale},
		{"301 s ahead", header(ts+301, hmacHex(testSecret, ts+301, testBody)), testSecret, testBody, ErrStale},
		{"t = 0", header(0, hmacHex(testSecret, 0, testBody)), testSecret, testBody, ErrStale},
		{"several v1, the second valid", header(ts, other, valid), testSecret, testBody, nil},
		{"several v1, the first valid", header(ts, valid, other), testSecret, testBody, nil},
		{"several v1, none valid", header(ts, other, other), testSecret, testBody, ErrMismatch},
		{"an unknown scheme beside v1 is ignored", header(ts, valid) + ",v2=abc", testSecret, testBody, nil},
		{"an unknown scheme alone", "t=" + strconv.FormatInt(ts, 10) + ",v0=" + valid, testSecret, testBody, ErrMalformed},
		{"legacy sha256= form", "sha256=" + hex.EncodeToString(hmacOf(testSecret, testBody)), testSecret, testBody, ErrMalformed},
		{"legacy sha256= form with t", "t=" + strconv.FormatInt(ts, 10) + ",sha256=" + valid, testSecret, testBody, ErrMalformed},
		{"legacy sha256= prefix in v1", header(ts, "sha256="+valid), testSecret, testBody, ErrMalformed},
		{"missing", "", testSecret, testBody, ErrMissing},
		{"no t", "v1=" + valid, testSecret, testBody, ErrMalformed},
		{"no v1", header(ts), testSecret, testBody, ErrMalformed},
		{"empty v1", header(ts) + ",v1=", testSecret, testBody, ErrMalformed},
		{"empty t", "t=,v1=" + valid, testSecret, testBody, ErrMalformed},
		{"non-hex v1", header(ts, strings.Repeat("zz", 32)), testSecret, testBody, ErrMalformed},
		{"short v1", header(ts, valid[:62]), testSecret, testBody, ErrMalformed},
		{"long v1", header(ts, valid+"00"), testSecret, testBody, ErrMalformed},
		{"odd-length v1", header(ts, valid+"0"), testSecret, testBody, ErrMalformed},
		{"duplicate t", header(ts, valid) + ",t=" + strconv.FormatInt(ts, 10), testSecret, testBody, ErrMalformed},
		{"negative t", "t=-" + strconv.FormatInt(ts, 10) + ",v1=" + valid, testSecret, testBody, ErrMalformed},
		{"signed t", "t=+" + strconv.FormatInt(ts, 10) + ",v1=" + valid, testSecret, testBody, ErrMalformed},
		{"leading zero t", "t=0" + strconv.FormatInt(ts, 10) + ",v1=" + valid, testSecret, testBody, ErrMalformed},
		{"fractional t", "t=" + strconv.FormatInt(ts, 10) + ".5,v1=" + valid, testSecret, testBody, ErrMalformed},
		{"huge t", "t=99999999999999999999,v1=" + valid, testSecret, testBody, ErrMalformed},
		{"milliseconds t", "t=" + strconv.FormatInt(ts*1000, 10) + ",v1=" + hmacHex(testSecret, ts*1000, testBody), testSecret, testBody, ErrMalformed},
		{"garbage", "garbage", testSecret, testBody, ErrMalformed},
		{"only commas", ",,,", testSecret, testBody, ErrMalformed},
		{"trailing comma", header(ts, valid) + ",", testSecret, testBody, ErrMalformed},
		{"leading comma", "," + header(ts, valid), testSecret, testBody, ErrMalformed},
		{"space after comma", "t=" + strconv.FormatInt(ts, 10) + ", v1=" + valid, testSecret, testBody, ErrMalformed},
		{"space around =", "t = " + strconv.FormatInt(ts, 10) + ",v1=" + valid, testSecret, testBody, ErrMalformed},
		{"leading space", " " + header(ts, valid), testSecret, testBody, ErrMalformed},
		{"trailing space", header(ts, valid) + " ", testSecret, testBody, ErrMalformed},
		{"semicolons", "t=" + strconv.FormatInt(ts, 10) + ";v1=" + valid, testSecret, testBody, ErrMalformed},
		{"upper-case key", "T=" + strconv.FormatInt(ts, 10) + ",V1=" + valid, testSecret, testBody, ErrMalformed},
		{"value with =", header(ts, valid+"="), testSecret, testBody, ErrMalformed},
		{"non-ASCII", header(ts, valid) + ",x=é", testSecret, testBody, ErrMalformed},
		{"too many v1", header(ts, other, other, other, other, other, other, other, other, valid), testSecret, testBody, ErrMalformed},
		{"too long", header(ts, valid) + ",x=" + strings.Repeat("a", MaxSignatureHeader), testSecret, testBody, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := Verify(tc.header, tc.secret, tc.body, testNow); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
				t.Fatalf("Verify(%q) = %v, want %v", tc.header, err, tc.want)
			}
		})
	}
}

func hmacOf(secret, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write(body)
	return h.Sum(nil)
}

func TestSignWithTwoSecretsForARotation(t *testing.T) {
	old, next := []byte("old secret"), []byte("new secret")
	h := Sign(testNow, testBody, old, next)
	for _, secret := range [][]byte{old, next} {
		if err := Verify(h, secret, testBody, testNow); err != nil {
			t.Fatalf("secret %q: %v", secret, err)
		}
	}
	if err := Verify(h, []byte("a third"), testBody, testNow); !errors.Is(err, ErrMismatch) {
		t.Fatalf("a third secret: %v", err)
	}
}

func TestParseSignature(t *testing.T) {
	v := hmacHex(testSecret, 5, testBody)
	sig, err := ParseSignature("t=5,v1=" + v + ",v1=" + strings.ToUpper(v))
	if err != nil || sig.Timestamp != 5 || len(sig.V1) != 2 || hex.EncodeToString(sig.V1[1]) != v {
		t.Fatalf("%+v %v", sig, err)
	}
	if _, err := ParseSignature(""); !errors.Is(err, ErrMissing) {
		t.Fatalf("empty: %v", err)
	}
}

func TestStatusOrder(t *testing.T) {
	// from → the statuses it may move to.
	allowed := map[Status][]Status{
		Queued:    {Sent, Delivered, Read, Failed},
		Sent:      {Delivered, Read, Failed},
		Delivered: {Read},
		Read:      nil,
		Failed:    nil,
	}
	for _, from := range Statuses {
		for _, to := range Statuses {
			want := false
			for _, a := range allowed[from] {
				want = want || a == to
			}
			if got := to.Advances(from); got != want {
				t.Errorf("%s → %s: Advances = %v, want %v", from, to, got, want)
			}
		}
		if Status("bogus").Advances(from) || from.Advances("bogus") {
			t.Errorf("an unknown status moves from or to %s", from)
		}
	}
}
