package cluster

import (
	"log"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport is memberlist's own network transport with every byte counted:
// UDP packets (sync messages, the live view's reports, memberlist's probes and gossip)
// and TCP streams (state transfers on join and push/pull, fallback probes), so that
// converger_cluster_sync_bytes_total is all the cluster's traffic, whatever the path.
// A packet is one message; so is a stream (its bytes are counted as they pass).
type countingTransport struct {
	*memberlist.NetTransport
	m       *metrics
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
}

// newCountingTransport binds host:port (port 0: a free port, the same for TCP and
// UDP, retried as memberlist does).
func newCountingTransport(host string, port int, logger *log.Logger, m *metrics) (*countingTransport, error) {
	var nt *memberlist.NetTransport
	var err error
	for range 10 {
		nt, err = memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: logger})
		if err == nil || port != 0 {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	t := &countingTransport{NetTransport: nt, m: m,
		packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), done: make(chan struct{})}
	go t.relayPackets()
	go t.relayStreams()
	return t, nil
}

func (t *countingTransport) sent(n int) {
	t.m.msgSent.Inc()
	t.m.bytesSent.Add(float64(n))
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	at, err := t.NetTransport.WriteTo(b, addr)
	if err == nil {
		t.sent(len(b))
	}
	return at, err
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	at, err := t.NetTransport.WriteToAddress(b, a)
	if err == nil {
		t.sent(len(b))
	}
	return at, err
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }
func (t *countingTransport) StreamCh() <-chan net.Conn           { return t.streams }

func (t *countingTransport) relayPackets() {
	in := t.NetTransport.PacketCh()
	for {
		select {
		case p := <-in:
			t.m.msgRecv.Inc()
			t.m.bytesRecv.Add(float64(len(p.Buf)))
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *countingTransport) relayStreams() {
	in := t.NetTransport.StreamCh()
	for {
		select {
		case c := <-in:
			t.m.msgRecv.Inc()
			select {
			case t.streams <- &countingConn{Conn: c, m: t.m}:
			case <-t.done:
				c.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.NetTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	t.m.msgSent.Inc()
	return &countingConn{Conn: c, m: t.m}, nil
}

// Shutdown stops the listeners first, while the relays still drain what they hand
// over: a listener blocked handing a packet to a relay that had already stopped would
// never exit, and NetTransport.Shutdown waits for it.
func (t *countingTransport) Shutdown() error {
	err := t.NetTransport.Shutdown()
	t.once.Do(func() { close(t.done) })
	return err
}

// countingConn counts a stream's bytes both ways.
type countingConn struct {
	net.Conn
	m *metrics
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.m.bytesRecv.Add(float64(n))
	}
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.m.bytesSent.Add(float64(n))
	}
	return n, err
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)
