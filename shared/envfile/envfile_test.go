package envfile

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
)

func TestGetenv(t *testing.T) {
	files := map[string]string{
		"/run/keys/signing": "c2VjcmV0\n",
		"/run/keys/crlf":    "abc\r\n",
		"/run/keys/empty":   "",
		"/run/big":          strings.Repeat("x", MaxSize+1),
		"/run/binary":       "\xff\xfe",
	}
	reads := 0
	read := func(p string) ([]byte, error) {
		reads++
		if v, ok := files[p]; ok {
			return []byte(v), nil
		}
		return nil, &fs.PathError{Op: "open", Path: p, Err: fs.ErrNotExist}
	}
	e := New([]string{
		"TOKEN_SIGNING_KEY_FILE=/run/keys/signing",
		"A_FILE=/run/keys/crlf",
		"B_FILE=/run/keys/empty",
		"PLAIN=value=with=equals",
		"EMPTY_FILE=",
		"SSL_CERT_FILE=/run/big", // never asked for as SSL_CERT: never read
	}, read)
	for name, want := range map[string]string{
		"TOKEN_SIGNING_KEY": "c2VjcmV0", "A": "abc", "B": "", "PLAIN": "value=with=equals",
		"EMPTY": "", "SSL_CERT_FILE": "/run/big", "UNSET": "",
	} {
		if got := e.Getenv(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	e.Getenv("TOKEN_SIGNING_KEY")
	if err := e.Err(); err != nil || reads != 3 {
		t.Fatalf("err %v, %d reads (want 3: each file once, SSL_CERT_FILE never)", err, reads)
	}

	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"K_FILE=/missing"}, "K_FILE: open /missing"},
		{[]string{"K_FILE=/run/big"}, "K_FILE: /run/big is larger than"},
		{[]string{"K_FILE=/run/binary"}, "not UTF-8"},
		{[]string{"K=inline", "K_FILE=/run/keys/signing"}, "K and K_FILE are both set"},
	} {
		e := New(tc.env, read)
		if v := e.Getenv("K"); v != "" {
			t.Errorf("%v: K = %q, want \"\" for an unusable file", tc.env, v)
		}
		err := e.Err()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one containing %q", tc.env, err, tc.want)
		}
		if tc.want == "K_FILE: open /missing" && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the file's error is wrapped: %v", err)
		}
	}
}
