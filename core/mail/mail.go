// Package mail sends the core's email (password reset links): through an SMTP server
// when SMTP_URL is set, else to the log, which is meant for development only.
package mail

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// DefaultFrom is the sender address when SMTP_FROM is unset.
const DefaultFrom = "converger@localhost"

// Message is one plain-text email to one recipient.
type Message struct {
	To, Subject, Body string
}

// Sender sends email.
type Sender interface {
	Send(ctx context.Context, m Message) error
}

// SMTP sends through an SMTP server: STARTTLS when the server offers it (smtp://), or
// TLS from the first byte (smtps://), and AUTH PLAIN when a user is given. net/smtp
// refuses to send a password over an unencrypted connection except to localhost.
type SMTP struct {
	Host string
	Port string
	// Username and Password authenticate with AUTH PLAIN; no authentication when
	// Username is empty.
	Username, Password string
	// ImplicitTLS: the connection is TLS from the start (smtps://).
	ImplicitTLS bool
	// From is the sender address (SMTP_FROM).
	From string
	// TLSConfig verifies the server (nil: the system's roots and Host).
	TLSConfig *tls.Config
	// Timeout bounds a whole Send when the context has no earlier deadline (default 30 s).
	Timeout time.Duration
}

// ParseURL reads an SMTP_URL: smtp://[user[:password]@]host[:port] (port 587 by
// default) or smtps://... (port 465). Errors never contain the password.
func ParseURL(raw string) (*SMTP, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, errors.New("must be a URL such as smtp://user:password@mail.example.com:587 (special characters in the password percent-encoded)")
	}
	s := &SMTP{From: DefaultFrom}
	switch u.Scheme {
	case "smtp":
		s.Port = "587"
	case "smtps":
		s.Port, s.ImplicitTLS = "465", true
	default:
		return nil, errors.New("the scheme must be smtp:// (STARTTLS when offered) or smtps:// (TLS)")
	}
	s.Host = u.Hostname()
	if s.Host == "" {
		return nil, errors.New("the URL needs a host, such as smtp://mail.example.com:587")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, errors.New("the port must be a number from 1 to 65535")
		}
		s.Port = p
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, errors.New("the URL takes no path, query or fragment")
	}
	if u.User != nil {
		s.Username = u.User.Username()
		s.Password, _ = u.User.Password()
	}
	return s, nil
}

// Redacted is the server's URL without the password, for logs.
func (s *SMTP) Redacted() string {
	scheme := "smtp"
	if s.ImplicitTLS {
		scheme = "smtps"
	}
	u := url.URL{Scheme: scheme, Host: net.JoinHostPort(s.Host, s.Port)}
	if s.Username != "" {
		u.User = url.User(s.Username)
	}
	return u.String()
}

// Send delivers m.
func (s *SMTP) Send(ctx context.Context, m Message) error {
	msg, err := Format(s.From, m, time.Now())
	if err != nil {
		return err
	}
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addr := net.JoinHostPort(s.Host, s.Port)
	tlsConfig := s.TLSConfig
	if tlsConfig == nil {
		tlsConfig = &tls.Config{ServerName: s.Host, MinVersion: tls.VersionTLS12}
	}
	var conn net.Conn
	if s.ImplicitTLS {
		d := tls.Dialer{Config: tlsConfig}
		conn, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return fmt.Errorf("mail: connecting to %s: %w", addr, err)
	}
	defer conn.Close()
	// The context bounds every read and write; cancelling it closes the connection.
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	c, err := smtp.NewClient(conn, s.Host)
	if err != nil {
		return fmt.Errorf("mail: %s: %w", addr, err)
	}
	defer c.Close()
	if !s.ImplicitTLS {
		if ok, _ := c.Extension("STARTTLS"); ok {
			if err := c.StartTLS(tlsConfig); err != nil {
				return fmt.Errorf("mail: STARTTLS with %s: %w", addr, err)
			}
		}
	}
	if s.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.Username, s.Password, s.Host)); err != nil {
			return fmt.Errorf("mail: authenticating with %s: %w", addr, err)
		}
	}
	from, _ := mail.ParseAddress(s.From)
	to, _ := mail.ParseAddress(m.To)
	if err := c.Mail(from.Address); err != nil {
		return fmt.Errorf("mail: MAIL FROM: %w", err)
	}
	if err := c.Rcpt(to.Address); err != nil {
		return fmt.Errorf("mail: RCPT TO: %w", err)
	}
	w, err := c.Data()
	if err != nil {
		return fmt.Errorf("mail: DATA: %w", err)
	}
	if _, err := w.Write(msg); err != nil {
		return fmt.Errorf("mail: writing the message: %w", err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("mail: the server refused the message: %w", err)
	}
	// The message is accepted; a failing QUIT changes nothing.
	_ = c.Quit()
	return nil
}

// Format returns m as an RFC 5322 message from from, dated now: UTF-8 text in
// quoted-printable, the subject encoded when it is not ASCII. Addresses are checked, and
// a subject with a line break is refused, so that no header can be injected.
func Format(from string, m Message, now time.Time) ([]byte, error) {
	f, err := mail.ParseAddress(from)
	if err != nil {
		return nil, fmt.Errorf("mail: sender %q is not an email address", from)
	}
	to, err := mail.ParseAddress(m.To)
	if err != nil {
		return nil, errors.New("mail: the recipient is not an email address")
	}
	if strings.ContainsAny(m.Subject, "\r\n") {
		return nil, errors.New("mail: the subject contains a line break")
	}
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	domain := f.Address[strings.LastIndexByte(f.Address, '@')+1:]
	var b bytes.Buffer
	fmt.Fprintf(&b, "From: %s\r\n", f.String())
	fmt.Fprintf(&b, "To: %s\r\n", to.String())
	fmt.Fprintf(&b, "Subject: %s\r\n", mime.QEncoding.Encode("utf-8", m.Subject))
	fmt.Fprintf(&b, "Date: %s\r\n", now.Format(time.RFC1123Z))
	fmt.Fprintf(&b, "Message-ID: <%s@%s>\r\n", hex.EncodeToString(id), domain)
	b.WriteString("MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n")
	qp := quotedprintable.NewWriter(&b)
	if _, err := qp.Write([]byte(m.Body)); err != nil {
		return nil, err
	}
	if err := qp.Close(); err != nil {
		return nil, err
	}
	b.WriteString("\r\n")
	return b.Bytes(), nil
}

// Log "sends" email by writing it to a logger at info: recipient, subject and body.
// The body of a password reset holds a working link, so this is for development only.
type Log struct {
	Logger *slog.Logger
	From   string
}

// Send logs m.
func (l Log) Send(ctx context.Context, m Message) error {
	l.Logger.InfoContext(ctx, "email not sent (SMTP_URL is unset); its content follows",
		"from", l.From, "to", m.To, "subject", m.Subject, "body", m.Body)
	return nil
}
