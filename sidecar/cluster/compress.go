package cluster

import (
	"bytes"
	"compress/flate"
	"errors"
	"io"
	"sync"
)

// Version 3 of the sync message is a version 2 message compressed with DEFLATE, once per
// flush for every member that reads it. memberlist's own compression (which this node
// turns off) compressed every packet again for every member it went to, with a fresh
// 256 KiB LZW table each time: at 20 members that was most of a sidecar's sync CPU.
//
//	message3 := version(1 byte: 3) deflate(message of version 2)

// rawPerPacket3 is how much a version 3 packet is filled before compression: values of
// client addresses and ids compress to a third to a half, so that one packet carries two
// to three times the values of a version 2 one. A message that compresses to more than
// maxPacket is split again at maxPacket (which compresses to at most a few bytes more).
const rawPerPacket3 = 3 * maxPacket

// pack3 encodes values into version 3 messages of at most about maxPacket bytes.
func pack3(sentAt int64, origin string, values []value) [][]byte {
	p := newPacker2(sentAt, origin, rawPerPacket3)
	for _, v := range values {
		p.add(v)
	}
	var out [][]byte
	i := 0
	for j, m := range p.messages() {
		seg := values[i : i+p.counts[j]]
		i += p.counts[j]
		if c := compress3(m); len(c) <= maxPacket {
			out = append(out, c)
			continue
		}
		q := newPacker2(sentAt, origin, maxPacket)
		for _, v := range seg {
			q.add(v)
		}
		for _, m := range q.messages() {
			out = append(out, compress3(m))
		}
	}
	return out
}

// maxInflated bounds what a version 3 message may inflate to: a message is at most one
// packet of values, which compresses a few times at best; anything larger is hostile.
const maxInflated = 64 << 10

var (
	deflaters = sync.Pool{New: func() any {
		w, _ := flate.NewWriter(nil, flate.BestSpeed)
		return w
	}}
	inflaters = sync.Pool{New: func() any { return flate.NewReader(nil) }}
)

// compress3 returns the version 3 form of a version 2 message.
func compress3(msg []byte) []byte {
	return deflate([]byte{version3}, msg)
}

// deflate returns head followed by msg compressed with DEFLATE.
func deflate(head, msg []byte) []byte {
	var buf bytes.Buffer
	buf.Grow(len(head) + len(msg)/2 + 16)
	buf.Write(head)
	w := deflaters.Get().(*flate.Writer)
	w.Reset(&buf)
	_, _ = w.Write(msg) // a bytes.Buffer does not fail
	_ = w.Close()
	deflaters.Put(w)
	return buf.Bytes()
}

var errTooLarge = errors.New("cluster message inflates beyond its bound")

// inflate3 returns the version 2 message inside a version 3 one (b without its version
// byte).
func inflate3(b []byte) ([]byte, error) {
	out, err := inflate(b)
	if err == nil && (len(out) == 0 || out[0] != version2) {
		return nil, errMalformed
	}
	return out, err
}

// inflate returns what b, compressed with DEFLATE, holds: at most maxInflated bytes.
func inflate(b []byte) ([]byte, error) {
	r := inflaters.Get().(io.ReadCloser)
	defer inflaters.Put(r)
	if err := r.(flate.Resetter).Reset(bytes.NewReader(b), nil); err != nil {
		return nil, errMalformed
	}
	out, err := io.ReadAll(io.LimitReader(r, maxInflated+1))
	switch {
	case err != nil:
		return nil, errMalformed
	case len(out) > maxInflated:
		return nil, errTooLarge
	}
	return out, nil
}
