package mail_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"io"
	"log/slog"
	"math/big"
	"mime"
	"mime/quotedprintable"
	"net"
	netmail "net/mail"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/converger/edge/core/mail"
)

func TestParseURL(t *testing.T) {
	s, err := mail.ParseURL("smtp://user:p%40ss@mail.example.com")
	if err != nil || s.Host != "mail.example.com" || s.Port != "587" || s.ImplicitTLS || s.Username != "user" ||
		s.Password != "p@ss" || s.From != mail.DefaultFrom {
		t.Fatalf("%+v %v", s, err)
	}
	if s.Redacted() != "smtp://user@mail.example.com:587" {
		t.Fatalf("redacted %q", s.Redacted())
	}
	s, err = mail.ParseURL("smtps://mail.example.com:2465")
	if err != nil || s.Port != "2465" || !s.ImplicitTLS || s.Username != "" {
		t.Fatalf("%+v %v", s, err)
	}
	if s, err := mail.ParseURL("smtps://mail.example.com"); err != nil || s.Port != "465" {
		t.Fatalf("%+v %v", s, err)
	}
	for _, bad := range []string{"http://mail.example.com", "smtp://", "smtp://u:s3cret@h:99999", "smtp://u:s3cret@h/path",
		"smtp://u:s3cret@h?x=1", "mail.example.com:25", "smtp://u:s3cret@h:notaport"} {
		_, err := mail.ParseURL(bad)
		if err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestFormat(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	long := "https://core.example.com/admin/password/reset/" + strings.Repeat("A", 80)
	raw, err := mail.Format("Converger <converger@example.com>", mail.Message{To: "ann@example.com",
		Subject: "Réinitialiser", Body: "Hello\n\n" + long + "\n.\nend\n"}, now)
	if err != nil {
		t.Fatal(err)
	}
	m, err := netmail.ReadMessage(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	subject, _ := new(mime.WordDecoder).DecodeHeader(m.Header.Get("Subject"))
	if subject != "Réinitialiser" || m.Header.Get("To") != "<ann@example.com>" ||
		m.Header.Get("From") != `"Converger" <converger@example.com>` || m.Header.Get("Message-Id") == "" ||
		m.Header.Get("Date") != now.Format(time.RFC1123Z) {
		t.Fatalf("headers %v", m.Header)
	}
	body, _ := io.ReadAll(quotedprintable.NewReader(m.Body))
	if !strings.Contains(string(body), long+"\r\n") {
		t.Fatalf("the link does not survive the encoding:\n%s", body)
	}
	for _, bad := range []mail.Message{
		{To: "ann@example.com", Subject: "a\r\nBcc: eve@example.com"},
		{To: "ann@example.com\r\nBcc: eve@example.com", Subject: "a"},
		{To: "not an address", Subject: "a"},
	} {
		if _, err := mail.Format("converger@example.com", bad, now); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestLogSender(t *testing.T) {
	var b bytes.Buffer
	l := mail.Log{Logger: slog.New(slog.NewTextHandler(&b, nil)), From: mail.DefaultFrom}
	if err := l.Send(context.Background(), mail.Message{To: "ann@example.com", Subject: "Hi", Body: "the link"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"level=INFO", "to=ann@example.com", "subject=Hi", `body="the link"`} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("log %q lacks %s", b.String(), want)
		}
	}
}

// fakeSMTP is an SMTP server on loopback that records what it receives.
type fakeSMTP struct {
	t        *testing.T
	addr     string
	tls      *tls.Config
	implicit bool // TLS from the first byte
	startTLS bool // offers STARTTLS
	user     string
	password string

	mu       sync.Mutex
	received []received
}

type received struct {
	from, to, data string
	authed, tls    bool
}

func newFake(t *testing.T, f *fakeSMTP) *fakeSMTP {
	t.Helper()
	f.t = t
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if f.implicit {
		ln = tls.NewListener(ln, f.tls)
	}
	f.addr = ln.Addr().String()
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { f.serve(c) })
		}
	})
	return f
}

func (f *fakeSMTP) serve(c net.Conn) {
	defer func() { c.Close() }()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	r := textproto.NewReader(bufio.NewReader(c))
	write := func(s string) { _, _ = io.WriteString(c, s+"\r\n") }
	write("220 fake ESMTP")
	var cur received
	cur.tls = f.implicit
	for {
		line, err := r.ReadLine()
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			write("250-fake")
			if f.startTLS && !cur.tls {
				write("250-STARTTLS")
			}
			write("250 AUTH PLAIN")
		case "STARTTLS":
			write("220 go ahead")
			tc := tls.Server(c, f.tls)
			if err := tc.Handshake(); err != nil {
				return
			}
			c, cur.tls = tc, true
			r = textproto.NewReader(bufio.NewReader(c))
		case "AUTH":
			mech, resp, _ := strings.Cut(arg, " ")
			b, _ := base64.StdEncoding.DecodeString(resp)
			if mech == "PLAIN" && string(b) == "\x00"+f.user+"\x00"+f.password {
				cur.authed = true
				write("235 ok")
			} else {
				write("535 authentication failed")
			}
		case "MAIL":
			cur.from = arg
			write("250 ok")
		case "RCPT":
			cur.to = arg
			write("250 ok")
		case "DATA":
			write("354 go ahead")
			data, err := r.ReadDotBytes()
			if err != nil {
				return
			}
			cur.data = string(data)
			f.mu.Lock()
			f.received = append(f.received, cur)
			f.mu.Unlock()
			write("250 queued")
		case "QUIT":
			write("221 bye")
			return
		default:
			write("250 ok")
		}
	}
}

func (f *fakeSMTP) messages() []received {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]received(nil), f.received...)
}

// selfSigned returns a server config and a client config that trusts it, for 127.0.0.1.
func selfSigned(t *testing.T) (server, client *tls.Config) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake smtp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}},
		&tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
}

func sender(t *testing.T, url string, f *fakeSMTP, client *tls.Config) *mail.SMTP {
	t.Helper()
	s, err := mail.ParseURL(strings.Replace(url, "ADDR", f.addr, 1))
	if err != nil {
		t.Fatal(err)
	}
	s.From, s.TLSConfig, s.Timeout = "converger@example.com", client, 5*time.Second
	return s
}

var msg = mail.Message{To: "ann@example.com", Subject: "Reset your password", Body: "Open this link:\n\nhttps://x.example/r/abc\n"}

func TestSMTP(t *testing.T) {
	serverTLS, clientTLS := selfSigned(t)
	ctx := context.Background()
	t.Run("AUTH PLAIN on loopback without TLS", func(t *testing.T) {
		f := newFake(t, &fakeSMTP{user: "u", password: "p@ss"})
		if err := sender(t, "smtp://u:p%40ss@ADDR", f, clientTLS).Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		got := f.messages()
		if len(got) != 1 || !got[0].authed || got[0].tls || got[0].from != "FROM:<converger@example.com>" ||
			got[0].to != "TO:<ann@example.com>" || !strings.Contains(got[0].data, "Subject: Reset your password") ||
			!strings.Contains(got[0].data, "https://x.example/r/abc") {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("STARTTLS when offered", func(t *testing.T) {
		f := newFake(t, &fakeSMTP{tls: serverTLS, startTLS: true, user: "u", password: "pw"})
		if err := sender(t, "smtp://u:pw@ADDR", f, clientTLS).Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if got := f.messages(); len(got) != 1 || !got[0].tls || !got[0].authed {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("smtps", func(t *testing.T) {
		f := newFake(t, &fakeSMTP{tls: serverTLS, implicit: true})
		if err := sender(t, "smtps://ADDR", f, clientTLS).Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if got := f.messages(); len(got) != 1 || !got[0].tls || got[0].authed {
			t.Fatalf("%+v", got)
		}
	})
	t.Run("an untrusted certificate", func(t *testing.T) {
		f := newFake(t, &fakeSMTP{tls: serverTLS, startTLS: true})
		err := sender(t, "smtp://ADDR", f, &tls.Config{ServerName: "127.0.0.1"}).Send(ctx, msg)
		if err == nil || len(f.messages()) != 0 {
			t.Fatalf("sent over an unverified TLS connection: %v", err)
		}
	})
	t.Run("a wrong password", func(t *testing.T) {
		f := newFake(t, &fakeSMTP{user: "u", password: "right"})
		err := sender(t, "smtp://u:wrong-s3cret@ADDR", f, clientTLS).Send(ctx, msg)
		if err == nil || strings.Contains(err.Error(), "wrong-s3cret") || len(f.messages()) != 0 {
			t.Fatalf("%v", err)
		}
	})
	t.Run("nothing listening", func(t *testing.T) {
		s, _ := mail.ParseURL("smtp://127.0.0.1:1")
		s.Timeout = 2 * time.Second
		if err := s.Send(ctx, msg); err == nil {
			t.Fatal("no error")
		}
	})
}
