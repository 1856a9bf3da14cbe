package cluster

import (
	"bytes"
	"compress/flate"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"reflect"
	"testing"
)

// TestVersion3RoundTrip: a version 3 message is its version 2 message compressed; it
// decodes to the same values, and is smaller when the values repeat (a busy flush).
func TestVersion3RoundTrip(t *testing.T) {
	p := newPacker2(1_700_000_000_000, "node-1#0123456789abcdef", maxPacket)
	var want []value
	for i := range 20 {
		v := value{bucket: "token_create", id: clientAddr(i), sizeMS: 60_000, endMS: 1_700_000_060_000, count: uint32(i),
			share: true, refused: 1, limit: 100}
		if i%2 == 0 {
			v.cap, v.capped = 7, true
		}
		p.add(v)
		want = append(want, v)
	}
	msgs := p.messages()
	if len(msgs) != 1 {
		t.Fatalf("%d messages", len(msgs))
	}
	c := compress3(msgs[0])
	if c[0] != version3 || len(c) >= len(msgs[0]) {
		t.Fatalf("version %d, %d bytes compressed from %d", c[0], len(c), len(msgs[0]))
	}
	m, err := decode(c)
	if err != nil {
		t.Fatal(err)
	}
	if m.version != version3 || m.origin != "node-1#0123456789abcdef" || !sameMessage(message{version: version3, sentAt: m.sentAt, origin: m.origin, values: want}, m) {
		t.Fatalf("decoded %+v", m)
	}
	// The pooled compressor gives the same bytes again.
	if again := compress3(msgs[0]); !bytes.Equal(again, c) {
		t.Fatal("a second compression differs")
	}
}

func clientAddr(i int) string { return "198.18.0." + string(rune('0'+i%10)) + string(rune('0'+i/10)) }

// TestVersion3Rejects: what does not inflate to one version 2 message is malformed, and
// a message inflating beyond its bound is refused before it is read whole.
func TestVersion3Rejects(t *testing.T) {
	deflate := func(b []byte) []byte {
		var buf bytes.Buffer
		buf.WriteByte(version3)
		w, _ := flate.NewWriter(&buf, flate.BestCompression)
		w.Write(b)
		w.Close()
		return buf.Bytes()
	}
	v1 := encode(message{sentAt: 1, origin: "a", values: sampleValues[:1]})
	v3 := compress3(encode(message{version: version2, sentAt: 1, origin: "a", values: sampleValues[:1]}))
	cases := map[string][]byte{
		"not deflate":          {version3, 0xff, 0xfe, 0x00},
		"empty":                {version3},
		"version 1 inside":     deflate(v1),
		"version 3 inside":     deflate(v3),
		"truncated":            v3[:len(v3)-2],
		"bomb":                 deflate(append([]byte{version2}, make([]byte, 10<<20)...)),
		"trailing bytes in v2": deflate(append(encode(message{version: version2, sentAt: 1, origin: "a"}), 0)),
	}
	for name, b := range cases {
		if _, err := decode(b); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	if _, err := decode(v3); err != nil {
		t.Fatal(err)
	}
}

// TestPack3 packs a large flush into compressed packets that each fit maxPacket, carrying
// every value once and in order: fewer packets than version 2 for client addresses, and
// split again when the values do not compress.
func TestPack3(t *testing.T) {
	const origin = "node-1#0123456789abcdef"
	for _, tc := range []struct {
		name  string
		id    func(i int) string
		fewer bool
	}{
		{"addresses", func(i int) string { return fmt.Sprintf("198.18.%d.%d", i/250, i%250) }, true},
		{"random", func(int) string { return hex.EncodeToString(randBytes(40)) }, false},
	} {
		var values []value
		for i := range 500 {
			values = append(values, value{bucket: "token_create", id: tc.id(i), sizeMS: 60_000, endMS: 1_700_000_060_000,
				count: uint32(i), share: true, limit: 100})
		}
		msgs := pack3(1_700_000_000_000, origin, values)
		p := newPacker2(1_700_000_000_000, origin, maxPacket)
		for _, v := range values {
			p.add(v)
		}
		v2 := len(p.messages())
		var got []value
		for _, m := range msgs {
			if len(m) > maxPacket+16 {
				t.Fatalf("%s: a %d-byte packet", tc.name, len(m))
			}
			d, err := decode(m)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, d.values...)
		}
		if !reflect.DeepEqual(got, values) {
			t.Fatalf("%s: %d values decoded of %d, or not the same", tc.name, len(got), len(values))
		}
		if tc.fewer && len(msgs)*2 > v2 {
			t.Errorf("%s: %d compressed packets against %d of version 2", tc.name, len(msgs), v2)
		}
		t.Logf("%s: %d packets, version 2 %d", tc.name, len(msgs), v2)
	}
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}
