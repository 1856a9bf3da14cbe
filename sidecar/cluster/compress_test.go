package cluster

import (
	"bytes"
	"compress/flate"
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
